"""Which device calls the engine makes at its start (device_setup.py), as mlx-lm's server makes
them: the wired limit on a device that reports a recommended working set (Metal), nothing on
one that reports none (this CPU), and never an error there."""

import mlx.core as mx

from engine import device_setup

METAL_INFO = {"architecture": "applegpu_g15s", "device_name": "Apple M3 Max", "memory_size": 64 << 30,
              "max_recommended_working_set_size": 48 << 30, "max_buffer_length": 32 << 30}


def test_metal_gets_the_recommended_working_set_as_its_wired_limit():
    assert device_setup.plan(METAL_INFO).wired_limit == 48 << 30


def test_a_device_without_a_recommended_working_set_is_left_alone():
    assert device_setup.plan({"architecture": "x86_64", "device_name": "AMD EPYC"}).wired_limit is None
    assert device_setup.plan({}).wired_limit is None


def test_on_this_cpu_the_setup_is_skipped_without_error():
    setup = device_setup.apply(mx)  # the real device: calls nothing that could fail on the CPU
    if mx.default_device() == mx.cpu:
        assert setup.wired_limit is None
    device_setup.check_model(None, setup)


def test_a_model_near_the_working_set_is_warned_about_as_generate_does():
    setup = device_setup.plan(METAL_INFO)
    assert device_setup.model_warning(40 << 30, setup) is None  # 83% of 48 GiB
    warning = device_setup.model_warning(45 << 30, setup)  # 94%
    assert warning and "46080 MB" in warning and "49152 MB" in warning
    assert device_setup.model_warning(1 << 40, device_setup.plan({})) is None  # no working set: nothing to say
