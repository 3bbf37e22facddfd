"""Our encoding of CRIU's RPC (platform/criurpc.py) against pycriu's generated rpc_pb2: the field
table matches rpc.proto's descriptor, every request npusnap sends serializes to the same bytes,
and CRIU's answers decode to the same values. The tests may import protobuf; the CLI never does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from npusnap_cli.criuopts import CriuOptions, InheritFd
from npusnap_cli.errors import CriuFailed
from npusnap_cli.platform import criu as criu_mod
from npusnap_cli.platform import criurpc

rpc_pb2 = pytest.importorskip("pycriu.rpc_pb2")

# Every option npusnap can put into a request, set at once (ghost_limit at its uint32 maximum).
ALL_OPTIONS = CriuOptions(
    link_remap=True, ghost_limit=(1 << 32) - 1, ext_unix_sk=True, tcp_close=True, skip_in_flight=True,
    network_lock="nftables", external=("unix[123]", "net[4026531992]:extnet"),
    inherit_fd=(InheritFd(0, "pipe:[12345]"), InheritFd(2, "file[ab:cd]")), manage_cgroups="strict",
    cgroup_root=("/job", "cpu,memory:/prefix"), cgroup_yard="/run/yard", force_irmap=True,
    irmap_scan_path=("/srv", "/dåta"), join_ns=("net:/run/netns/blue", "user:1234,0,0"))

_KINDS = {criurpc.INT32: "TYPE_INT32", criurpc.UINT32: "TYPE_UINT32", criurpc.BOOL: "TYPE_BOOL",
          criurpc.ENUM: "TYPE_ENUM", criurpc.STRING: "TYPE_STRING", criurpc.MESSAGE: "TYPE_MESSAGE"}


@pytest.mark.parametrize("name", sorted(criurpc._MESSAGES))
def test_each_field_matches_rpc_proto(name: str) -> None:
    descriptor = rpc_pb2.DESCRIPTOR.message_types_by_name[name]
    fd_type = type(descriptor.fields[0])
    for field_name, ours in criurpc._MESSAGES[name].FIELDS.items():
        theirs = descriptor.fields_by_name[field_name]
        assert ours.number == theirs.number, field_name
        assert theirs.type == getattr(fd_type, _KINDS[ours.kind]), field_name
        assert ours.repeated == theirs.is_repeated, field_name
        if ours.kind == criurpc.MESSAGE:
            assert ours.message == theirs.message_type.name, field_name
        elif not ours.repeated:
            assert ours.default == theirs.default_value, field_name


def test_enums_match_rpc_proto() -> None:
    for enum in rpc_pb2.DESCRIPTOR.enum_types_by_name.values():
        for value in enum.values:
            assert getattr(criurpc, value.name) == value.number, value.name


def _requests(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rpc: Any) -> list[Any]:
    """The requests Criu's methods send, built with `rpc`'s messages, captured instead of sent."""
    sent: list[Any] = []

    def request(self: Any, req: Any, **kwargs: Any) -> Any:
        sent.append(req)
        return rpc.criu_resp(type=req.type, success=True, restore=rpc.criu_restore_resp(pid=4242),
                             version=rpc.criu_version(major_number=4, minor_number=2))

    monkeypatch.setattr(criu_mod, "rpc_messages", lambda: rpc)
    monkeypatch.setattr(criu_mod.Swrk, "request", request)
    monkeypatch.setattr(criu_mod, "_dir_fds", lambda *dirs: _FakeFds(len(dirs)))
    c = criu_mod.Criu(criu_mod.CriuBinary("/nonexistent/criu", (4, 2)))
    for leave_running, leave_stopped, timeout in ((False, False, None), (True, True, 17.9)):
        c.dump(criu_mod.DumpOptions(pid=os.getpid(), images_dir=tmp_path, log_dir=tmp_path,
                                    leave_running=leave_running, leave_stopped=leave_stopped, shell_job=True,
                                    tcp_established=True, timeout=timeout, log_level=1, extra=ALL_OPTIONS))
        c.dump(criu_mod.DumpOptions(pid=1, images_dir=tmp_path, log_dir=tmp_path))
    for shell_job in (False, True):
        assert c.restore(tmp_path, tmp_path, shell_job=shell_job, tcp_established=True, log_level=0,
                         extra=ALL_OPTIONS.for_restore(ALL_OPTIONS), leave_stopped=True) == 4242
    assert c.restore(tmp_path, tmp_path) == 4242
    assert c.check() == (True, "Looks good.")
    c.features()
    assert criu_mod._ask_version("/nonexistent/criu") == (4, 2)
    return sent


class _FakeFds:
    def __init__(self, n: int) -> None:
        self.fds = list(range(100, 100 + n))

    def __enter__(self) -> list[int]:
        return self.fds

    def __exit__(self, *exc: Any) -> None:
        pass


def test_every_request_npusnap_sends_encodes_as_protobuf_does(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    ours = _requests(monkeypatch, tmp_path, criurpc)
    theirs = _requests(monkeypatch, tmp_path, rpc_pb2)
    assert len(ours) == len(theirs) == 10
    for mine, reference in zip(ours, theirs):
        data = mine.SerializeToString()
        assert rpc_pb2.criu_req.FromString(data) == reference  # the same message, field for field
        assert data == reference.SerializeToString()  # and the same bytes
        assert criurpc.criu_req.FromString(data) == mine  # which we read back as we wrote them


def test_crius_answers_decode_as_protobuf_reads_them() -> None:
    answers = [rpc_pb2.criu_resp(type=rpc_pb2.RESTORE, success=True, restore=rpc_pb2.criu_restore_resp(pid=31337)),
               rpc_pb2.criu_resp(type=rpc_pb2.DUMP, success=False, cr_errno=-5, cr_errmsg="päge: No space ✗",
                                 dump=rpc_pb2.criu_dump_resp(restored=False)),
               rpc_pb2.criu_resp(type=rpc_pb2.VERSION, success=True,
                                 version=rpc_pb2.criu_version(major_number=4, minor_number=2, sublevel=1,
                                                              gitid="v4.2.1", name="CRIUancy", extra=-1)),
               rpc_pb2.criu_resp(type=rpc_pb2.FEATURE_CHECK, success=True,
                                 features=rpc_pb2.criu_features(mem_track=False, pidfd_store=True)),
               rpc_pb2.criu_resp(type=rpc_pb2.CHECK, success=True, status=(1 << 31) - 1)]
    for answer in answers:
        mine = criurpc.criu_resp.FromString(answer.SerializeToString())
        for f in answer.DESCRIPTOR.fields:
            assert mine.HasField(f.name) == answer.HasField(f.name), f.name
            if f.message_type is None:
                assert getattr(mine, f.name) == getattr(answer, f.name), f.name
                continue
            sub, ref = getattr(mine, f.name), getattr(answer, f.name)
            for g in ref.DESCRIPTOR.fields:
                assert sub.HasField(g.name) == ref.HasField(g.name), (f.name, g.name)
                assert getattr(sub, g.name) == getattr(ref, g.name), (f.name, g.name)
    assert not criurpc.criu_resp().HasField("version") and criurpc.criu_resp().version.major_number == 0


def test_unknown_fields_are_skipped_and_bad_data_refused() -> None:
    resp = rpc_pb2.criu_resp(type=rpc_pb2.DUMP, success=True)
    data = resp.SerializeToString() + b"\xa8\x06\x07" + b"\xb2\x06\x02hi"  # fields 101 and 102: a newer CRIU's
    mine = criurpc.criu_resp.FromString(data)
    assert mine.success and mine.type == criurpc.DUMP
    for bad in (b"\x08", b"\x4a\x05ab", b"\x0f"):  # a cut varint, a cut string, wire type 7
        with pytest.raises(ValueError):
            criurpc.criu_resp.FromString(bad)


def test_fields_refuse_what_protobuf_refuses() -> None:
    opts = criurpc.criu_opts(images_dir_fd=-1)
    with pytest.raises(AttributeError):
        opts.no_such_option = True
    with pytest.raises(TypeError):
        opts.pid = "12"
    with pytest.raises(ValueError):
        opts.ghost_limit = 1 << 32
    with pytest.raises(AttributeError):
        opts.external = ["x"]  # type: ignore[misc]


def test_a_garbled_answer_is_one_criu_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """CRIU answering bytes that are no criu_resp: a CriuFailed, not a traceback."""
    fake = tmp_path / "criu"
    fake.write_text("#!/usr/bin/python3\nimport socket, sys\n"
                    "s = socket.socket(fileno=int(sys.argv[2])); s.recv(4096); s.send(b'\\x0f\\x01')\n")
    fake.chmod(0o755)
    with pytest.raises(CriuFailed, match="not an RPC answer"):
        criu_mod.Swrk(str(fake)).request(criurpc.criu_req(type=criurpc.CHECK), timeout=20)
