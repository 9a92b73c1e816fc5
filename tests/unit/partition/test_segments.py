"""SegmentList (pylog.partition.segments): the one owner of a partition's ordered segments, their base offsets
and the layout epoch. Checked against a plain sorted list as the reference model, over random sequences of
the changes a partition makes (rolls, retention, compaction merges, truncation, recovery)."""

from __future__ import annotations

import os
import random

import pytest

from pylog.partition.segment import MapCache, Segment
from pylog.partition.segments import SegmentList


def _check(layout: SegmentList, model: list[int]) -> None:
    assert [s.base_offset for s in layout] == model
    assert layout.active.base_offset == model[-1]
    for probe in range(-1, model[-1] + 5):
        expected = max((i for i, b in enumerate(model) if b <= probe), default=0)
        assert layout.index_for(probe) == expected
    assert list(layout.by_base()) == model


@pytest.mark.parametrize("seed", range(20))
def test_changes_keep_bases_sorted_and_bump_the_epoch_once(tmp_path: os.PathLike[str], seed: int) -> None:
    rng = random.Random(seed)
    layout = SegmentList(os.fspath(tmp_path), MapCache(4), dense=True)
    layout.reset([layout.new_segment(0)])
    model = [0]
    epoch = layout.epoch
    assert epoch == 1
    for _ in range(60):
        op = rng.choice(["roll", "roll", "retention", "merge", "truncate", "reset"])
        if op == "roll":
            base = model[-1] + rng.randint(1, 9)
            layout.append_segment(layout.new_segment(base))
            model.append(base)
        elif op == "retention":
            n = rng.randint(0, len(model))
            gone = layout.remove_oldest(n)
            assert [s.base_offset for s in gone] == model[: min(n, len(model) - 1)]
            if not gone:
                assert layout.epoch == epoch
                continue
            del model[: len(gone)]
        elif op == "merge" and len(model) > 2:
            i = rng.randrange(len(model) - 2)
            n = rng.randint(1, len(model) - 1 - i)
            run = layout.find_run(layout[i : i + n])
            assert run is not None
            layout.replace(run, layout.new_segment(model[i], dense=False))
            del model[i + 1 : i + n]
        elif op == "truncate":
            offset = rng.randint(0, model[-1] + 3)
            gone = layout.truncate(offset)
            kept = [model[0]] + [b for b in model[1:] if b < offset]
            assert [s.base_offset for s in gone] == model[len(kept) :][::-1]
            model = kept
        elif op == "reset":
            layout.reset([layout.new_segment(b) for b in model])
        else:
            continue
        assert layout.epoch == epoch + 1
        epoch = layout.epoch
        _check(layout, model)


def test_reset_from_the_shared_state_takes_its_epoch(tmp_path: os.PathLike[str]) -> None:
    layout = SegmentList(os.fspath(tmp_path), MapCache(4), dense=False)
    layout.reset([layout.new_segment(0), layout.new_segment(10)], 41)
    assert layout.epoch == 41 and not layout.active.dense
    layout.reset([layout.new_segment(0)])  # recovery: above every epoch this list had
    assert layout.epoch == 42


def test_find_run_refuses_a_run_that_changed(tmp_path: os.PathLike[str]) -> None:
    directory = os.fspath(tmp_path)
    for base in (0, 10, 20):
        with open(os.path.join(directory, f"{base:020d}.log"), "wb") as f:
            f.write(b"x" * 10)
    layout = SegmentList(directory, MapCache(4), dense=True)
    layout.reset([layout.new_segment(b) for b in (0, 10, 20)])
    for seg in layout:
        seg.size = 10
    olds = [Segment(directory, b, layout.cache) for b in (0, 10)]
    for seg in olds:
        seg.size = 10
    assert layout.find_run(olds) == layout[0:2]
    active = Segment(directory, 20, layout.cache)
    active.size = 10
    assert layout.find_run([*olds, active]) is None  # the active segment is never part of a run
    olds[1].size = 5  # appended to (or truncated) since the pass read it
    assert layout.find_run(olds) is None
    os.replace(os.path.join(directory, f"{0:020d}.log"), os.path.join(directory, "x"))
    with open(os.path.join(directory, f"{0:020d}.log"), "wb") as f:
        f.write(b"y" * 10)
    assert layout.find_run([Segment(directory, 0, layout.cache)]) is None  # another file under the name


def test_changes_refuse_to_break_the_order(tmp_path: os.PathLike[str]) -> None:
    layout = SegmentList(os.fspath(tmp_path), MapCache(4), dense=True)
    layout.reset([layout.new_segment(0), layout.new_segment(10)])
    with pytest.raises(ValueError):
        layout.append_segment(layout.new_segment(10))
    with pytest.raises(ValueError):
        layout.replace([layout[0]], layout.new_segment(5))
    assert [s.base_offset for s in layout] == [0, 10]
