"""The job restore's rendezvous directory (fresh per restore, private, never through a link), a
job checkpoint attempt's (fresh per attempt, beside DIR so that it outlives the commit's rename), and
the daemon a restore hands the runtimes (npusim only, only when named)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from npusnap_cli.core.job.coordinator import _attempt_rendezvous, _rendezvous
from npusnap_cli.core.restore import RestoreOptions, hand_daemon, on_daemon
from npusnap_cli.errors import StorageProblem
from npusnap_cli.image.format import DeviceState


def test_each_restore_meets_in_a_fresh_private_directory(tmp_path: Path) -> None:
    parent = tmp_path / "rendezvous"
    parent.mkdir()
    meet = _rendezvous(parent, "run1", None)
    assert meet == parent / "run1" and stat.S_IMODE(meet.stat().st_mode) == 0o700
    with pytest.raises(StorageProblem, match="cannot create the ranks' rendezvous directory"):
        _rendezvous(parent, "run1", None)  # a leftover of the same run is never reused


def test_a_linked_rendezvous_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "rendezvous").symlink_to(elsewhere)
    with pytest.raises(StorageProblem, match="cannot open .*rendezvous: not a directory"):
        _rendezvous(tmp_path / "rendezvous", "run1", None)
    assert list(elsewhere.iterdir()) == []


def test_each_checkpoint_attempt_meets_in_a_fresh_private_directory_beside_dir(tmp_path: Path) -> None:
    final = tmp_path / "ck"
    one, two = _attempt_rendezvous(final, None), _attempt_rendezvous(final, None)
    assert one != two and one.parent == two.parent == tmp_path
    assert one.name.startswith(".ck.rendezvous-") and stat.S_IMODE(one.stat().st_mode) == 0o700
    assert list(one.iterdir()) == [] and not final.exists()


def test_an_attempt_rendezvous_that_cannot_be_made_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StorageProblem, match="cannot create the ranks' rendezvous directory"):
        _attempt_rendezvous(tmp_path / "missing" / "ck", None)


class _Backend:
    def __init__(self) -> None:
        self.told: list[str] = []

    def use_daemon(self, socket: str) -> None:
        self.told.append(socket)


def test_the_daemon_is_handed_to_npusim_runtimes_only_when_named(tmp_path: Path) -> None:
    sim, ascend = DeviceState(backend="sim", endpoint="/old/daemon.sock"), DeviceState(backend="ascend")
    named = RestoreOptions(tmp_path, daemon_socket="/new/daemon.sock")
    b = _Backend()
    hand_daemon(b, sim, named)
    hand_daemon(b, ascend, named)
    hand_daemon(b, sim, RestoreOptions(tmp_path))
    assert b.told == ["/new/daemon.sock"]
    assert on_daemon(sim, named).endpoint == "/new/daemon.sock"  # the capacity check asks the new daemon
    assert on_daemon(sim, RestoreOptions(tmp_path)).endpoint == "/old/daemon.sock"
    assert on_daemon(ascend, named) is ascend
