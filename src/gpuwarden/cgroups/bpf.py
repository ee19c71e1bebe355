"""cgroup v2 device access: a BPF_PROG_TYPE_CGROUP_DEVICE program, assembled by hand.

On cgroup v2 there is no `devices.deny`; the kernel asks the BPF programs attached
to the cgroup (and to its ancestors: all must allow) at every open and mknod of a
device node, as runc and crun use it. The program gets
`struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }` in r1
(`access_type` = access << 16 | type, type 1 block, 2 char) and returns 1 to allow,
0 to deny. Ours denies NVIDIA GPU nodes (char, major 195, minor 0-253) other than
the leased ones and allows everything else:

    r2 = ctx->access_type; r2 &= 0xffff; if r2 != 2 goto allow
    r3 = ctx->major;  if r3 != 195 goto allow
    r4 = ctx->minor;  if r4 > 253 goto allow      (nvidia-modeset, nvidiactl)
    if r4 == leased[i] goto allow                  (one per leased GPU)
    r0 = 0; exit
    allow: r0 = 1; exit

On a machine with MIG slices, the capability nodes of the slices a job was not given
(`gpuwarden.cgroups.migcaps`: major M, minors denied[j]) are denied too: the minor is loaded
before the majors are compared, `if r3 == M goto caps` comes first, the GPU part
ends with `goto deny`, and then

    caps: if r4 == denied[j] goto deny; goto allow

so every jump goes forward, as the verifier of every kernel accepts.

`program()` is pure (bytes, tested as such); `load()` and `attach()` are the two
bpf(2) calls. The attachment holds the program: its descriptor can be closed,
and removing the cgroup detaches it.
"""

from __future__ import annotations

import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Optional

NVIDIA_MAJOR = 195
LAST_GPU_MINOR = 253
PROG_TYPE_CGROUP_DEVICE = 15
ATTACH_CGROUP_DEVICE = 6
F_ALLOW_MULTI = 2  # keep the programs already there (systemd's, a container's): all must allow
_PROG_LOAD, _PROG_ATTACH = 5, 8
_SYSCALL = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
_ATTR_SIZE = 128  # larger than either command's attr; the kernel wants the rest zero

# Opcodes (linux/bpf_common.h, linux/bpf.h).
_LDX_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W
_AND64_K = 0x57  # BPF_ALU64 | BPF_AND | BPF_K
_MOV64_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K
_JEQ_K = 0x15
_JNE_K = 0x55
_JGT_K = 0x25
_JA = 0x05
_EXIT = 0x95


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One `struct bpf_insn` (little-endian, as on every machine with NVIDIA GPUs)."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(leased: Iterable[int], caps: Optional[tuple[int, Iterable[int]]] = None) -> bytes:
    """The program allowing GPU nodes of minors `leased` only, and with `caps` (the
    nvidia-caps major and the minors to deny) none of those (see the module's text)."""
    keep = sorted(set(leased))
    for minor in keep:
        if not 0 <= minor <= LAST_GPU_MINOR:
            raise ValueError(f"minor {minor} is not a GPU node's (0-{LAST_GPU_MINOR})")
    if caps is not None and sorted(set(caps[1])):
        return _with_caps(keep, caps[0], sorted(set(caps[1])))
    n = len(keep)
    # Index of `allow`: 7 fixed instructions before the compares, then n compares, then deny (2).
    allow = 7 + n + 2

    def to(target: int, at: int) -> int:
        return target - at - 1

    code = [
        insn(_LDX_W, 2, 1, 0),
        insn(_AND64_K, 2, imm=0xFFFF),
        insn(_JNE_K, 2, off=to(allow, 2), imm=2),
        insn(_LDX_W, 3, 1, 4),
        insn(_JNE_K, 3, off=to(allow, 4), imm=NVIDIA_MAJOR),
        insn(_LDX_W, 4, 1, 8),
        insn(_JGT_K, 4, off=to(allow, 6), imm=LAST_GPU_MINOR),
        *(insn(_JEQ_K, 4, off=to(allow, 7 + i), imm=m) for i, m in enumerate(keep)),
        insn(_MOV64_K, 0, imm=0),
        insn(_EXIT),
        insn(_MOV64_K, 0, imm=1),
        insn(_EXIT),
    ]
    return b"".join(code)


def _with_caps(keep: list[int], major: int, denied: list[int]) -> bytes:
    """`program` for a machine with MIG slices: the GPU part, then the caps part."""
    n, d = len(keep), len(denied)
    caps = 8 + n + 1  # 8 fixed instructions, n compares, the jump to deny
    deny = caps + d + 1
    allow = deny + 2

    def to(target: int, at: int) -> int:
        return target - at - 1

    code = [
        insn(_LDX_W, 2, 1, 0),
        insn(_AND64_K, 2, imm=0xFFFF),
        insn(_JNE_K, 2, off=to(allow, 2), imm=2),
        insn(_LDX_W, 3, 1, 4),
        insn(_LDX_W, 4, 1, 8),
        insn(_JEQ_K, 3, off=to(caps, 5), imm=major),
        insn(_JNE_K, 3, off=to(allow, 6), imm=NVIDIA_MAJOR),
        insn(_JGT_K, 4, off=to(allow, 7), imm=LAST_GPU_MINOR),
        *(insn(_JEQ_K, 4, off=to(allow, 8 + i), imm=m) for i, m in enumerate(keep)),
        insn(_JA, off=to(deny, 8 + n)),
        *(insn(_JEQ_K, 4, off=to(deny, caps + j), imm=m) for j, m in enumerate(denied)),
        insn(_JA, off=to(allow, caps + d)),
        insn(_MOV64_K, 0, imm=0),
        insn(_EXIT),
        insn(_MOV64_K, 0, imm=1),
        insn(_EXIT),
    ]
    return b"".join(code)


def _bpf(cmd: int, attr: bytearray) -> int:
    import ctypes

    # os.uname(), not platform.machine(): the same name, without loading `platform` (and
    # with it, before Python 3.11, subprocess and threading) into the service's forker.
    machine = os.uname().machine
    number = _SYSCALL.get(machine)
    if number is None:
        raise OSError(0, f"bpf(2) syscall number unknown on {machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    result = libc.syscall(number, cmd, buf, len(attr))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def load(code: bytes) -> int:
    """Load `code` as a cgroup device program; its descriptor. The verifier's log is
    the error's text when it refuses the program."""
    import ctypes

    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = bytearray(_ATTR_SIZE)
    struct.pack_into(
        "<IIQQIIQ",
        attr,
        0,
        PROG_TYPE_CGROUP_DEVICE,
        len(code) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license_),
        1,  # log_level: the verifier says why, if it refuses
        len(log),
        ctypes.addressof(log),
    )
    try:
        return _bpf(_PROG_LOAD, attr)
    except OSError as err:
        why = log.value.decode(errors="replace").strip().splitlines()
        raise OSError(err.errno, f"{err.strerror}{': ' + why[-1] if why else ''}") from None


def attach(cgroup_dir: str, prog_fd: int) -> None:
    """Attach the loaded program to the cgroup at `cgroup_dir` (beside any already there)."""
    fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        attr = bytearray(_ATTR_SIZE)
        struct.pack_into("<IIII", attr, 0, fd, prog_fd, ATTACH_CGROUP_DEVICE, F_ALLOW_MULTI)
        _bpf(_PROG_ATTACH, attr)
    finally:
        os.close(fd)


def confine(
    cgroup_dir: str, leased: Iterable[int], caps: Optional[tuple[int, Iterable[int]]] = None
) -> None:
    """Let the processes in `cgroup_dir` open only the GPU nodes of minors `leased`, and
    none of the caps nodes `caps` names (major, minors)."""
    prog = load(program(leased, caps))
    try:
        attach(cgroup_dir, prog)
    finally:
        os.close(prog)
