"""cgroup v2 device isolation: the BPF program as bytes, and attached for real.

The same `mknod` nodes as in tests/test_cgroups.py: ENXIO where the program allows
the open (no driver behind the node), EPERM where it denies it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components import require
from gpuwarden.cgroups import bpf, hierarchy
from gpuwarden.sim.driverfiles import free_major
from repo import SRC

# --- cgroup v2: the BPF device program ---------------------------------------------------------


def _interpret(code: bytes, kind: int, major: int, minor: int, access: int = 6) -> int:
    """Run the assembled program over one access, with just the instructions it uses: a
    check of the bytes that does not need a kernel."""
    import struct

    regs = [0] * 11
    ctx = {0: (access << 16) | kind, 4: major, 8: minor}
    pc = 0
    insns = [struct.unpack("<BBhi", code[i : i + 8]) for i in range(0, len(code), 8)]
    while True:
        op, regs_byte, off, imm = insns[pc]
        dst, src = regs_byte & 0xF, regs_byte >> 4
        pc += 1
        if op == 0x61:
            assert src == 1
            regs[dst] = ctx[off]
        elif op == 0x57:
            regs[dst] &= imm
        elif op == 0xB7:
            regs[dst] = imm
        elif op == 0x05:  # goto
            pc += off
        elif op in (0x15, 0x55, 0x25):
            taken = {0x15: regs[dst] == imm, 0x55: regs[dst] != imm, 0x25: regs[dst] > imm}[op]
            pc += off if taken else 0
        elif op == 0x95:
            return regs[0]
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")


@given(leased=st.sets(st.integers(0, 253), max_size=8), minor=st.integers(0, 2**20))
def test_the_program_denies_exactly_other_gpu_nodes(leased: set[int], minor: int) -> None:
    code = bpf.program(leased)
    assert len(code) % 8 == 0
    gpu_node = minor <= 253
    expected = 0 if gpu_node and minor not in leased else 1
    assert _interpret(code, 2, 195, minor) == expected
    assert _interpret(code, 1, 195, minor) == 1  # a block device 195:N is not a GPU
    assert _interpret(code, 2, 196, minor) == 1  # nor another major
    assert _interpret(code, 2, 195, 255) == 1  # nvidiactl


@given(
    leased=st.sets(st.integers(0, 253), max_size=4),
    denied=st.sets(st.integers(0, 2**20), min_size=1, max_size=6),
    minor=st.integers(0, 2**20),
)
def test_with_mig_slices_the_program_also_denies_the_other_slices_caps(
    leased: set[int], denied: set[int], minor: int
) -> None:
    code = bpf.program(leased, (237, denied))
    assert _interpret(code, 2, 237, minor) == (0 if minor in denied else 1)
    assert _interpret(code, 1, 237, minor) == 1  # a block device is never fenced
    assert _interpret(code, 2, 195, minor) == (0 if minor <= 253 and minor not in leased else 1)
    assert _interpret(code, 2, 238, minor) == 1
    # Every jump goes forward: the verifier of any kernel loads it.
    import struct

    offsets = [struct.unpack_from("<BBhi", code, i)[2] for i in range(0, len(code), 8)]
    assert min(offsets) >= 0
    assert bpf.program(leased, (237, ())) == bpf.program(leased)


def test_the_program_bytes() -> None:
    assert bpf.program([2]).hex() == (
        "6112000000000000"  # r2 = ctx->access_type
        "57020000ffff0000"  # r2 &= 0xffff
        "5502070002000000"  # if r2 != 2 (char) goto allow
        "6113040000000000"  # r3 = ctx->major
        "55030500c3000000"  # if r3 != 195 goto allow
        "6114080000000000"  # r4 = ctx->minor
        "25040300fd000000"  # if r4 > 253 goto allow
        "1504020002000000"  # if r4 == 2 goto allow
        "b700000000000000"  # r0 = 0 (deny)
        "9500000000000000"  # exit
        "b700000001000000"  # allow: r0 = 1
        "9500000000000000"  # exit
    )
    with pytest.raises(ValueError):
        bpf.program([254])


def test_a_v2_job_cgroup_denies_other_gpus_for_real(tmp_path: Path) -> None:
    mounts = Path("/proc/self/mounts").read_text()
    require(
        os.geteuid() == 0 and hierarchy.v2_mount(mounts) is not None,
        "needs root and a cgroup v2 hierarchy (for a BPF device program)",
    )
    where = tmp_path / "dev"
    where.mkdir()
    for minor in (0, 1, 2, 3, 254, 255):
        os.mknod(where / f"n{minor}", 0o666 | 0o020000, os.makedev(195, minor))
    # Two MIG slices' caps nodes, of a major no driver here has: the other slice's denied.
    caps = free_major(Path("/proc/devices").read_text())
    for minor in (21, 22):
        os.mknod(where / f"cap{minor}", 0o666 | 0o020000, os.makedev(caps, minor))
    script = textwrap.dedent("""\
        import json, os, subprocess, sys
        sys.path.insert(0, sys.argv[1])
        from gpuwarden.cgroups import devices
        iso = devices.prepare("cgroup-v2-bpf")
        iso.confine([2], [], (int(sys.argv[3]), (21,)))
        probe = ("import json, os, sys\\n"
                 "def o(p):\\n"
                 "    try: os.close(os.open(p, os.O_RDWR)); return 'open'\\n"
                 "    except OSError as e: return {1: 'EPERM', 6: 'ENXIO'}.get(e.errno, e.errno)\\n"
                 "d = sys.argv[1]\\n"
                 "print(json.dumps({n: o(os.path.join(d, n)) for n in sorted(os.listdir(d))}))")
        def probed():
            argv = [sys.executable, "-c", probe, sys.argv[2]]
            return json.loads(subprocess.run(argv, capture_output=True, text=True).stdout)
        inside = probed()
        closed = iso.close()
        print(json.dumps([inside, closed, probed()]))
    """)
    out = subprocess.run(
        [sys.executable, "-c", script, str(SRC), str(where), str(caps)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    inside, closed, after = json.loads(out.stdout)
    assert inside == {
        "cap21": "EPERM",
        "cap22": "ENXIO",
        "n0": "EPERM",
        "n1": "EPERM",
        "n2": "ENXIO",
        "n254": "ENXIO",
        "n255": "ENXIO",
        "n3": "EPERM",
    }
    assert closed is True
    assert set(after.values()) == {"ENXIO"}
