"""`npusnap check`'s probes that need no CRIU: which file system a path lies on."""

from __future__ import annotations

from pathlib import Path

from npusnap_cli.platform.probe import fs_type

MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:25 / /run rw,nosuid shared:5 - ext4 /dev/vda rw
31 30 0:26 / /run rw,nosuid shared:6 - tmpfs tmpfs rw,size=1024k
32 22 0:27 / /running rw shared:7 - xfs /dev/vdb rw
33 30 0:28 / /run/user/1000 rw shared:8 - tmpfs tmpfs rw
"""


def test_the_deepest_and_latest_mount_wins(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    assert fs_type("/run", str(info)) == "tmpfs"  # mounted over the ext4 one
    assert fs_type("/run/criu.kdat", str(info)) == "tmpfs"
    assert fs_type("/run/user/1000/x", str(info)) == "tmpfs"
    assert fs_type("/runner", str(info)) == "ext4"  # not under /run, nor under /running
    assert fs_type("/running/x", str(info)) == "xfs"
    assert fs_type("/run", str(tmp_path / "missing")) is None
