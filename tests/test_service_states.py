"""A service job's states: a closed set, changed in the journal only by a move of the
table (service.states), and docs/architecture.md draws that table."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from gpuwarden.service import states, store
from gpuwarden.service.states import TRANSITIONS, IllegalMove

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
BEGIN = "<!-- states:begin (tests/test_service_states.py writes this) -->"
END = "<!-- states:end -->"


def _journal_with(tmp_path: Path, state: str) -> tuple[store.Store, int]:
    """A journal holding one job in `state`, written there as the service would."""
    journal = store.Store(str(tmp_path / f"{state}.db"))
    job = journal.add(
        store.new_job(uid=1, gid=1, user="a", argv=("x",), cwd="/", env={}, umask=18, request={})
    )
    path = {
        store.PENDING: [],
        store.STARTING: [store.STARTING],
        store.RUNNING: [store.STARTING, store.RUNNING],
    }.get(state, [store.STARTING, store.RUNNING, state])
    for step in path:
        journal.update(job.id, state=step)
    return journal, job.id


@pytest.mark.parametrize(("was", "to"), list(itertools.product(states.STATES, repeat=2)))
def test_every_pair_of_states_is_a_legal_move_or_refused(tmp_path: Path, was: str, to: str) -> None:
    journal, job_id = _journal_with(tmp_path, was)
    assert journal.get(job_id).state == was  # type: ignore[union-attr]
    if (was, to) in TRANSITIONS:
        journal.update(job_id, state=to, reason="moved")
        assert journal.get(job_id).state == to  # type: ignore[union-attr]
        assert store.Store(journal.path).get(job_id).state == to  # type: ignore[union-attr]
    else:
        with pytest.raises(IllegalMove, match=f"job {job_id}: no move from {was} to {to}"):
            journal.update(job_id, state=to, reason="moved")
        again = store.Store(journal.path).get(job_id)  # nothing of the change was written
        assert again is not None and (again.state, again.reason) == (was, None)
    journal.close()


def test_a_state_outside_the_closed_set_is_refused(tmp_path: Path) -> None:
    journal, job_id = _journal_with(tmp_path, store.PENDING)
    with pytest.raises(ValueError, match="no job state 'DONE'"):
        journal.update(job_id, state="DONE")
    assert journal.get(job_id).state == store.PENDING  # type: ignore[union-attr]


def test_the_table_joins_every_state_and_every_end_can_be_requeued() -> None:
    """Every state is reached from PENDING and leads back to it: no dead end, no orphan."""
    reach = {store.PENDING}
    while True:
        more = {to for was, to in TRANSITIONS if was in reach} - reach
        if not more:
            break
        reach |= more
    assert reach == set(states.STATES)
    assert all((end, store.PENDING) in TRANSITIONS for end in store.ENDED)
    assert not any(was == to for was, to in TRANSITIONS)  # a job never "moves" in place
    assert set(store.ACTIVE) | set(store.ENDED) == set(states.STATES)


def test_the_architecture_doc_draws_the_table() -> None:
    """docs/architecture.md shows `TRANSITIONS` between its `states:` markers;
    `GPUWARDEN_REGEN_DOCS=1` writes it there from the table."""
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"{DOC} lacks the states markers"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    drawn = f"{BEGIN}\n{states.table_markdown()}\n{END}"
    if os.environ.get("GPUWARDEN_REGEN_DOCS") == "1":
        DOC.write_text(head + drawn + tail, encoding="utf-8")
    assert BEGIN + rest.split(END, 1)[0] + END == drawn, (
        "docs/architecture.md's state table differs from service.states.TRANSITIONS: "
        "GPUWARDEN_REGEN_DOCS=1 pytest tests/test_service_states.py"
    )
