"""Point an ELF file's library search path (RUNPATH / RPATH) somewhere else, in place.

The build machine's interpreter is linked with an absolute RUNPATH to its own prefix; once
copied into the artifact it must find the copied libpython through `$ORIGIN` instead. The
new path is written over the old string in the file's string table, so it may not be
longer than the old one (what it replaces is always an absolute prefix, longer than a
short `$ORIGIN/..` path). 64-bit little-endian ELF only: what Linux x86_64 and arm64 run.
"""

import struct

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_STRTAB, DT_RPATH, DT_RUNPATH = 0, 5, 15, 29


def is_elf64(path) -> bool:
    with open(path, "rb") as f:
        head = f.read(6)
    return head[:4] == b"\x7fELF" and head[4] == 2 and head[5] == 1


def _segments(data: bytes):
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        yield p_type, offset, vaddr, filesz


def _search_path_strings(data: bytes):
    """(file offset, current text) of each RPATH / RUNPATH string."""
    segments = list(_segments(data))
    dynamic = [(offset, size) for p_type, offset, _v, size in segments if p_type == PT_DYNAMIC]
    if not dynamic:
        return []
    offset, size = dynamic[0]
    entries, strtab = [], None
    for pos in range(offset, offset + size, 16):
        tag, value = struct.unpack_from("<qQ", data, pos)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = value
        elif tag in (DT_RPATH, DT_RUNPATH):
            entries.append(value)
    if strtab is None:
        return []
    # DT_STRTAB is an address: the file offset is where its loaded segment comes from.
    base = next(off + strtab - vaddr for p_type, off, vaddr, size in segments
                if p_type == PT_LOAD and vaddr <= strtab < vaddr + size)
    found = []
    for value in entries:
        start = base + value
        end = data.index(b"\0", start)
        found.append((start, data[start:end].decode()))
    return found


def search_paths(path) -> list:
    with open(path, "rb") as f:
        return [text for _, text in _search_path_strings(f.read())]


def replace_search_path(path, old_prefix: str, new_path: str) -> bool:
    """Replace every RPATH / RUNPATH entry that starts with `old_prefix` by `new_path`; True if any was."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    changed = False
    for start, text in _search_path_strings(bytes(data)):
        entries = text.split(":")
        if not any(e.startswith(old_prefix) for e in entries):
            continue
        new = ":".join(dict.fromkeys(new_path if e.startswith(old_prefix) else e for e in entries)).encode()
        if len(new) > len(text):
            raise ValueError(f"{path}: the search path {new!r} is longer than the one it replaces ({text!r})")
        data[start:start + len(text)] = new + b"\0" * (len(text) - len(new))
        changed = True
    if changed:
        with open(path, "r+b") as f:
            f.write(data)
    return changed
