"""Memory a process madvised MADV_HUGEPAGE comes back as huge pages, with its contents: the CRIU
that scripts/install-criu.sh builds gives the advice back before it reads the pages in
(scripts/criu-patches/), where upstream CRIU faults them all in as 4 KiB pages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import WORKLOADS, Workload, npusnap, requires_criu

pytestmark = requires_criu

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def anon_huge_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_madvised_huge_pages_are_restored_as_huge_pages(tmp_path: Path) -> None:
    if not THP.exists() or "[never]" in THP.read_text():
        pytest.skip("this kernel offers no transparent huge pages")
    check = tmp_path / "check"
    w = Workload([sys.executable, str(WORKLOADS / "hugepages.py"), str(check)], tmp_path / "out")
    try:
        digest = w.wait_for_line("ready")[-1].split()[1]
        before = anon_huge_kib(w.pid)
        if before == 0:
            pytest.skip("the kernel gave the workload no huge page (memory too fragmented)")
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", check=True)
        w.proc.wait(timeout=10)
        npusnap("restore", tmp_path / "ck", "--detach", check=True)
        after = anon_huge_kib(w.pid)
        assert after >= before // 2, f"{after} KiB of huge pages after the restore, {before} KiB before"
        check.touch()
        w.wait_for_line("digest")
        assert w.lines()[-1] == f"digest {digest}"
        w.wait_exit()
    finally:
        w.stop()
