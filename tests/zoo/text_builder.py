"""One tiny random-weight model per text family the installed mlx-lm ships, built with its own classes.

Each family's config is shrunk (text_configs.py), its `Model` built from its `ModelArgs`, seeded,
and conditioned so greedy decoding is well defined and depends on the whole prompt: random
init gives flat logits, near-ties and text that repeats one token, so the layers' matrices are
scaled up, the output head (or, where the head is the embedding, the final norm) is scaled
until the logits have a standard deviation of about 3, and the special tokens' rows (end of
sequence included) are shrunk so greedy never stops early. The weights are saved in mlx-lm's
own layout with the zoo's small tokenizer (tiny_tokenizer.py), then loaded back through
`mlx_lm.load`: a directory is only kept when the library loads it and the conditioning held.

Built once per machine into the models cache (beside tests/family_models.py's), one folder per
family named by its recipe (config, builder version, mlx-lm version), built in a temporary
folder and renamed under a lock, so concurrent test runs share it. A family that cannot be
built says why: "library-cannot" when mlx-lm itself fails here (its module needs a package not
installed, a Metal-only kernel, NaN on the CPU), "not-built" when the zoo's recipe falls short.

Run `python tests/zoo/text_builder.py [family...]` to build them (one JSON line each).
"""

import contextlib
import hashlib
import importlib
import io
import json
import logging
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

if __name__ == "__main__":  # run as a script: the tests' and the backend's modules by bare name
    _TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [os.path.join(os.path.dirname(_TESTS), "backend"), _TESTS]

from models import building  # noqa: E402
from zoo import text_configs, text_families, tiny_tokenizer  # noqa: E402
from zoo.conditioning import LOGIT_STD, LibraryCannot, condition, fill_packed, logits, spread  # noqa: E402

log = logging.getLogger("zoo.text")

BUILD_VERSION = 1  # bump when the recipe here or in conditioning.py changes (configs are hashed on their own)
PROBE = "The quick brown fox jumps over the lazy dog. Count 1, 2, 3, 4"


@dataclass
class Built:
    family: str
    status: str  # "built", "not-built" (the zoo's recipe falls short) or "library-cannot"
    path: Optional[str] = None
    reason: str = ""


def default_root() -> Path:
    from models import models_root

    return models_root() / "zoo-text"


def tokenizer_dir(root: Path) -> Path:
    """The zoo's tokenizer, trained once into `root`."""
    target = root / f"tokenizer-{_digest(Path(tiny_tokenizer.__file__).read_text())}"
    with building(target) as tmp:
        if not (target / "tokenizer.json").exists():
            shutil.rmtree(tmp, ignore_errors=True)
            tiny_tokenizer.write(tmp)
            tmp.rename(target)
    return target


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:10]


def _import(family: str):
    """The family's mlx-lm module; LibraryCannot when it does not import here (olmo's prints
    which package it needs and exits the interpreter)."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return importlib.import_module(f"mlx_lm.models.{text_families.module_of(family)}")
    except (ImportError, SystemExit) as e:
        said = printed.getvalue().strip() or f"{type(e).__name__}: {e}"
        raise LibraryCannot(f"mlx-lm's module does not import here: {said}") from None


def build(family: str, root: Path = None, configs: str = "text_configs") -> Built:
    """The family's tiny model directory, built once (seeded: the same weights every time);
    `configs`: the zoo's module whose config_of gives the config (group_configs: one that divides
    over ranks)."""
    root = Path(root) if root is not None else default_root()
    tokenizer = tokenizer_dir(root)
    try:
        _import(family)
        shrink = importlib.import_module(f"zoo.{configs}").config_of
        cfg = dict(shrink(family, _n_tokens(tokenizer)), eos_token_id=_eos_id(tokenizer))
    except LibraryCannot as e:
        return _unrunnable(family, {"model_type": family}, tokenizer, root, str(e), constructible=False)
    except Exception as e:
        return Built(family, "not-built", reason=f"no tiny config: {type(e).__name__}: {e}")
    target = root / f"{family}-{_digest([cfg, BUILD_VERSION, text_families.version()])}"
    with building(target) as tmp:
        if (target / "model.safetensors").exists():
            return Built(family, "built", str(target))
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            _make(family, cfg, tokenizer, tmp)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            failure = e
        else:
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
            return Built(family, "built", str(target))
    said = f"{type(failure).__name__}: {failure}"[:400]
    if isinstance(failure, LibraryCannot):
        return _unrunnable(family, cfg, tokenizer, root, str(failure))
    if "Metal" in said:  # e.g. "[metal_kernel] No Metal back-end."
        return _unrunnable(family, cfg, tokenizer, root, f"its forward pass needs a Metal-only kernel ({said})")
    log.debug("%s: not built", family, exc_info=failure)
    return Built(family, "not-built", reason=said)


def _unrunnable(family: str, cfg: dict, tokenizer: Path, root: Path, reason: str, constructible=True) -> Built:
    """A directory of a family the library cannot run here, as a checkpoint of it would be, so
    the matrix can check the server refuses it with the reason: the family's random weights
    where its classes build, else one placeholder array (olmo's module exits before reading any)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    target = root / f"{family}-unrunnable-{_digest([cfg, BUILD_VERSION, text_families.version()])}"
    with building(target) as tmp:
        if not (target / "model.safetensors").exists():
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            weights = dict(tree_flatten(_fresh(family, cfg).parameters())) if constructible else {}
            _save(weights or {"placeholder": mx.zeros((1,))}, cfg, tokenizer, tmp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
    return Built(family, "library-cannot", str(target), reason)


def _save(weights: dict, cfg: dict, tokenizer: Path, out: Path) -> None:
    import mlx.core as mx

    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in tokenizer.iterdir():
        shutil.copyfile(f, out / f.name)


def _vocab(tokenizer: Path) -> dict:
    return json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"]


def _n_tokens(tokenizer: Path) -> int:
    return len(_vocab(tokenizer))


def _eos_id(tokenizer: Path) -> int:
    return _vocab(tokenizer)[tiny_tokenizer.EOS]


def _make(family: str, cfg: dict, tokenizer: Path, out: Path) -> None:
    """Build, condition and save into `out`; then load it through `mlx_lm.load` and check the
    conditioning survived the library's own loading (baichuan_m1's loader normalizes the head's
    rows, undoing a scaled head: such a family is conditioned through its final norm instead)."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load

    probe, specials, n_tokens = _probe_ids(tokenizer), tiny_tokenizer.special_ids(tokenizer), _n_tokens(tokenizer)
    for via_norm in (False, True):
        model = _fresh(family, cfg)
        condition(model, probe, specials, n_tokens, via_norm)
        _save(dict(tree_flatten(model.parameters())), cfg, tokenizer, out)
        std = spread(logits(load(str(out))[0], probe)[:, :n_tokens])
        if LOGIT_STD / 2 <= std <= LOGIT_STD * 2:
            return
        (out / "model.safetensors").unlink()
    raise RuntimeError(f"its logits after mlx_lm.load spread {std:.2g}, not about {LOGIT_STD}: not conditioned")


def _fresh(family: str, cfg: dict):
    """The family's seeded random model as mlx_lm.load would hold it (its sanitize applied)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(cfg)
    mx.random.seed(sum(map(ord, family)))
    model = model_class(args_class.from_dict(cfg))
    fill_packed(model)
    weights = dict(tree_flatten(model.parameters()))
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    model.load_weights(list(weights.items()))
    mx.eval(model.parameters())
    return model


def _probe_ids(tokenizer: Path) -> list:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer / "tokenizer.json")).encode(PROBE).ids


def build_all(families=None, root: Path = None, configs: str = "text_configs") -> list:
    """Built for each family (default: every family mlx-lm ships), in order.

    Built in worker processes, not this one: a family whose forward pass crashes the process
    must not take the caller with it (phi3small's did while the zoo gave it a vocabulary
    smaller than the token ids its code writes to: out of bounds, MLX crashed or not). The outcome of
    every family is kept in a manifest named by the recipe's sources, so a later run with
    nothing changed starts no worker at all."""
    families = list(families or text_families.families())
    root = Path(root) if root is not None else default_root()
    manifest = root / f"manifest-{_digest([BUILD_VERSION, text_families.version(), _sources(configs)])}.json"
    known = _read(manifest)
    missing = [f for f in families if f not in known or not _usable(known[f])]
    if missing:
        known.update(_in_workers(missing, root, configs))
        _write(manifest, known)
    return [Built(**known[f]) for f in families]


def _sources(configs: str = "text_configs") -> list:
    here = Path(__file__).parent
    return [(here / name).read_text()
            for name in dict.fromkeys(("text_builder.py", "text_configs.py", f"{configs}.py", "tiny_tokenizer.py",
                                       "conditioning.py"))]


def _usable(entry: dict) -> bool:
    return entry["path"] is None or (Path(entry["path"]) / "model.safetensors").exists()


def _read(manifest: Path) -> dict:
    try:
        return json.loads(manifest.read_text())
    except (OSError, ValueError):
        return {}


def _write(manifest: Path, known: dict) -> None:
    manifest.parent.mkdir(parents=True, exist_ok=True)
    tmp = manifest.with_name(f"{manifest.name}.{os.getpid()}")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    os.replace(tmp, manifest)


def _in_workers(families: list, root: Path, configs: str = "text_configs") -> dict:
    """{family: Built as a dict}, built by `python text_builder.py --worker`; when a worker dies,
    the family it was building is the one that killed it, and a new worker takes the rest."""
    import signal
    import subprocess

    done, pending = {}, list(families)
    while pending:
        proc = subprocess.Popen([sys.executable, __file__, "--worker", str(root), configs, *pending],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=3600)
        for line in out.splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                done[entry["family"]] = entry
        pending = [f for f in pending if f not in done]
        if not pending:
            break
        if proc.returncode >= 0:
            raise RuntimeError(f"the zoo's builder stopped early (exit {proc.returncode}): {err[-2000:]}")
        for torn in root.glob(f"*.partial-{proc.pid}"):  # what the dead worker was writing
            shutil.rmtree(torn, ignore_errors=True)
        crashed = pending.pop(0)
        how = signal.Signals(-proc.returncode).name
        done[crashed] = asdict(Built(crashed, "library-cannot",
                                     reason=f"its forward pass crashes the process here ({how}, in MLX on the CPU)"))
        log.warning("%s: the builder crashed (%s)", crashed, how)
    return done


if __name__ == "__main__":  # python tests/zoo/text_builder.py [family...]: build them, one JSON line each
    logging.basicConfig(level=logging.WARNING)
    if sys.argv[1:2] == ["--worker"]:
        for family in sys.argv[4:]:
            print(json.dumps(asdict(build(family, Path(sys.argv[2]), sys.argv[3]))), flush=True)
    else:
        for b in build_all(sys.argv[1:] or None):
            print(json.dumps(asdict(b)))
