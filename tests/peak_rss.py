"""The peak resident memory a call costs a server process (Linux /proc)."""


def _kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} for process {pid}")


def peak_growth_mb(pid: int, call):
    """(call's result, MB by which the process's resident high-water mark rose above its
    resident size before the call). The high-water mark is reset first (clear_refs 5), so
    an earlier peak cannot hide this call's."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    before = _kib(pid, "VmRSS")
    result = call()
    return result, (_kib(pid, "VmHWM") - before) / 1024
