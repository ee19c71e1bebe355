"""sbatch's --array syntax, --param sweeps and output patterns (gpuwarden.planning.arrayspec)."""

from __future__ import annotations

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.planning import arrayspec


@pytest.mark.parametrize(
    ("text", "tasks", "throttle"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("7", (7,), None),
        ("1,3,7", (1, 3, 7), None),
        ("0-15:4", (0, 4, 8, 12), None),
        ("0-99%8", tuple(range(100)), 8),
        ("0-3,10-20:5%2", (0, 1, 2, 3, 10, 15, 20), 2),
        ("3,1,3", (1, 3), None),
    ],
)
def test_slurm_array_specs_read_as_sbatch_reads_them(
    text: str, tasks: tuple[int, ...], throttle: int | None
) -> None:
    assert arrayspec.parse(text) == arrayspec.ArraySpec(tasks, throttle)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("0-", "not a task id or a range"),
        ("5-1", "ends before it starts"),
        ("0-9%0", "%0 must be a whole number"),
        ("0-9%", "must be a whole number"),
        ("0-99999", "has 100000 tasks; the most an array may have is 10000"),
        ("0-99999999999999999", "not a task id"),
        ("0-4000001", "task ids go up to"),
        ("1-5:0", "a step of 1 or more"),
        ("", "empty --array"),
        ("a-b", "not a task id"),
        ("1,,2", "not a task id"),
    ],
)
def test_malformed_array_specs_are_one_line(text: str, said: str) -> None:
    with pytest.raises(UserError) as err:
        arrayspec.parse(text)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_a_sweep_is_the_cartesian_product_in_loop_order() -> None:
    params = arrayspec.sweep(["lr=0.1,0.01", "seed=1,2,3"])
    assert arrayspec.size(params) == 6
    combos = [arrayspec.combination(params, i) for i in range(6)]
    assert combos[0] == {"lr": "0.1", "seed": "1"}
    assert combos[1] == {"lr": "0.1", "seed": "2"}
    assert combos[5] == {"lr": "0.01", "seed": "3"}
    assert len({tuple(c.items()) for c in combos}) == 6
    assert arrayspec.env_name("lr") == "GPUWARDEN_PARAM_LR"
    for bad in (["lr"], ["1x=2"], ["lr=1,,2"], ["lr=1", "LR=2"]):
        with pytest.raises(UserError):
            arrayspec.sweep(bad)
    assert arrayspec.throttle_only("%3") == 3
    with pytest.raises(UserError, match="only a throttle"):
        arrayspec.throttle_only("0-5")


def test_tasks_are_shown_and_named_as_squeue_does() -> None:
    assert arrayspec.compact([40, 41, 42, 7, 99, 98]) == "7,40-42,98-99"
    assert arrayspec.label(12, range(40, 100), 8) == "12_[40-99%8]"
    assert arrayspec.label(12, [7]) == "12_7"
    assert arrayspec.task_name("12_7") == (12, 7)
    assert arrayspec.task_name("12") is None and arrayspec.task_name("0_1") is None
    fills = {"A": 12, "a": 7, "j": 19, "u": "alice"}
    assert arrayspec.output_path("out/%A_%a-%j.%u.log", fills) == "out/12_7-19.alice.log"
    assert arrayspec.output_path("t%3a-%%-%x", fills) == "t007-%-%x"
