"""CRIU's RPC messages (images/rpc.proto) in our own small protobuf encoder and decoder.

pycriu's rpc_pb2 needs the protobuf runtime, ~45 ms of imports on every checkpoint and restore
for a request of a few dozen bytes. This module speaks the same wire format (proto2: varints and
length-delimited fields) for the messages and fields npusnap uses, with the attribute names of
the generated classes, so code written against rpc_pb2 (criuopts.CriuOptions.apply) works with
either. The field table is written once here; tests/unit/test_criu_rpc.py checks every entry
against rpc_pb2's descriptor and round-trips every option npusnap sends through both.

Semantics kept from protobuf's proto2 classes: a field assigned (even its default) is present
and serialized; HasField says whether it was set or decoded; reading an unset field gives its
default (an empty message for a message field); unknown fields in an answer are skipped."""

from __future__ import annotations

from typing import Any, ClassVar, Iterable, Iterator, Optional

# Enums: the module-level names rpc_pb2 has.
EMPTY, DUMP, RESTORE, CHECK, PRE_DUMP, PAGE_SERVER, NOTIFY = 0, 1, 2, 3, 4, 5, 6
CPUINFO_DUMP, CPUINFO_CHECK, FEATURE_CHECK, VERSION, WAIT_PID, PAGE_SERVER_CHLD, SINGLE_PRE_DUMP = (
    7, 8, 9, 10, 11, 12, 13)
IGNORE, CG_NONE, PROPS, SOFT, FULL, STRICT, DEFAULT = 0, 1, 2, 3, 4, 5, 6  # criu_cg_mode
IPTABLES, NFTABLES, SKIP = 1, 2, 3  # criu_network_lock_method
SPLICE, VM_READ = 1, 2  # criu_pre_dump_mode

# Field kinds, by how they travel: varint (signed 32-bit, unsigned 32-bit, bool, enum) or
# length-delimited (string, nested message).
INT32, UINT32, BOOL, ENUM, STRING, MESSAGE = "int32", "uint32", "bool", "enum", "string", "message"
_VARINT_KINDS = (INT32, UINT32, BOOL, ENUM)


class Field:
    __slots__ = ("number", "kind", "repeated", "default", "message")

    def __init__(self, number: int, kind: str, repeated: bool = False, default: Any = None,
                 message: Optional[str] = None) -> None:
        self.number, self.kind, self.repeated, self.message = number, kind, repeated, message
        self.default = default if default is not None else {STRING: "", BOOL: False}.get(kind, 0)


class Repeated(list):  # type: ignore[type-arg]
    """A repeated field: a list, plus `add(**fields)` for a repeated message field."""

    def __init__(self, message: Optional[type["Message"]] = None) -> None:
        super().__init__()
        self._message = message

    def add(self, **fields: Any) -> "Message":
        if self._message is None:
            raise TypeError("add() is for repeated message fields")
        item = self._message(**fields)
        self.append(item)
        return item


class Message:
    """One protobuf message: FIELDS maps a field's name to its Field."""

    FIELDS: ClassVar[dict[str, Field]] = {}

    def __init__(self, **fields: Any) -> None:
        object.__setattr__(self, "_values", {})
        for name, value in fields.items():
            if name in self.FIELDS and self.FIELDS[name].repeated:
                getattr(self, name).extend(value)
            else:
                setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        f = self.FIELDS.get(name)
        if f is None:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        if f.repeated:
            raise AttributeError(f"assignment to repeated field {name!r}: use extend() or add()")
        if f.kind == MESSAGE:
            if not isinstance(value, _MESSAGES[f.message or ""]):
                raise TypeError(f"{name} takes a {f.message}, not {type(value).__name__}")
        elif f.kind == STRING:
            if not isinstance(value, str):
                raise TypeError(f"{name} takes a str, not {type(value).__name__}")
        elif f.kind == BOOL:
            value = bool(value)
        elif not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} takes an int, not {type(value).__name__}")
        elif not (-(1 << 31) <= value < (1 << 31) if f.kind in (INT32, ENUM) else 0 <= value < (1 << 32)):
            raise ValueError(f"{name}: {value} is out of range for {f.kind}")
        self._values[name] = value

    def __getattr__(self, name: str) -> Any:
        f = self.FIELDS.get(name)
        if f is None:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        values: dict[str, Any] = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        if f.repeated:  # created on first use, as the list its caller fills
            return values.setdefault(name, Repeated(_MESSAGES[f.message] if f.message else None))
        if f.kind == MESSAGE:
            return _MESSAGES[f.message or ""]()  # unset: an empty one, not stored
        return f.default

    def HasField(self, name: str) -> bool:  # noqa: N802 (protobuf's name)
        f = self.FIELDS.get(name)
        if f is None or f.repeated:
            raise ValueError(f"{type(self).__name__} has no singular field {name!r}")
        return name in self._values

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._present() == other._present()

    def _present(self) -> dict[str, Any]:
        return {k: v for k, v in self._values.items() if not (isinstance(v, Repeated) and not v)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._present().items())})"

    # ------------------------------------------------------------------ the wire format

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name)
        out = bytearray()
        for name, f in sorted(self.FIELDS.items(), key=lambda item: item[1].number):
            if name not in self._values:
                continue
            value = self._values[name]
            for item in (value if f.repeated else (value,)):
                if f.kind in _VARINT_KINDS:
                    out += _varint((f.number << 3) | 0)
                    out += _varint(int(item) & ((1 << 64) - 1))  # negative int32: ten bytes, as protobuf
                else:
                    data = item.encode() if f.kind == STRING else item.SerializeToString()
                    out += _varint((f.number << 3) | 2) + _varint(len(data)) + data
        return bytes(out)

    def ParseFromString(self, data: bytes) -> int:  # noqa: N802 (protobuf's name)
        """Reads a serialized message into this one (cleared first). Raises ValueError on bad data."""
        self._values.clear()
        by_number = {f.number: (name, f) for name, f in self.FIELDS.items()}
        for number, wire, raw in raw_fields(data):
            if number not in by_number:
                continue  # a newer CRIU's field: skipped, as protobuf keeps it unknown
            name, f = by_number[number]
            for value in _values_of(f, wire, raw):
                if f.repeated:
                    getattr(self, name).append(value)
                else:
                    self._values[name] = value
        return len(data)

    @classmethod
    def FromString(cls, data: bytes) -> "Message":  # noqa: N802 (protobuf's name)
        msg = cls()
        msg.ParseFromString(data)
        return msg


def raw_fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """A serialized message's fields in order, as (number, wire type, raw value): an int for a
    varint, bytes for a fixed-width or length-delimited field. Raises ValueError on bad data."""
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        raw: Any
        if wire == 0:
            raw, pos = read_varint(data, pos)
        elif wire == 2:
            length, pos = read_varint(data, pos)
            raw, pos = data[pos:pos + length], pos + length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            raw, pos = data[pos:pos + width], pos + width
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated message")
        yield number, wire, raw


def _values_of(f: Field, wire: int, raw: Any) -> Iterable[Any]:
    if f.kind in _VARINT_KINDS:
        if wire == 2:  # a packed repeated field
            pos, out = 0, []
            while pos < len(raw):
                n, pos = read_varint(raw, pos)
                out.append(_scalar(f, n))
            return out
        if wire != 0:
            raise ValueError(f"field {f.number}: wire type {wire} for a {f.kind}")
        return [_scalar(f, raw)]
    if wire != 2:
        raise ValueError(f"field {f.number}: wire type {wire} for a {f.kind}")
    if f.kind == STRING:
        return [bytes(raw).decode("utf-8", errors="replace")]
    return [_MESSAGES[f.message or ""].FromString(bytes(raw))]


def _scalar(f: Field, n: int) -> Any:
    if f.kind == BOOL:
        return n != 0
    if f.kind == UINT32:
        return n & 0xFFFFFFFF
    n &= 0xFFFFFFFF  # int32 and enums: the low 32 bits, signed (protobuf's truncation)
    return n - (1 << 32) if n & 0x80000000 else n


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


# ---------------------------------------------------------------------- the messages (rpc.proto)


class criu_page_server_info(Message):  # noqa: N801 (rpc.proto's names)
    FIELDS = {"address": Field(1, STRING), "port": Field(2, INT32), "pid": Field(3, INT32), "fd": Field(4, INT32)}


class join_namespace(Message):  # noqa: N801
    FIELDS = {"ns": Field(1, STRING), "ns_file": Field(2, STRING), "extra_opt": Field(3, STRING)}


class inherit_fd(Message):  # noqa: N801
    FIELDS = {"key": Field(1, STRING), "fd": Field(2, INT32)}


class cgroup_root(Message):  # noqa: N801
    FIELDS = {"ctrl": Field(1, STRING), "path": Field(2, STRING)}


class criu_opts(Message):  # noqa: N801
    """The options npusnap sets (and a few neighbours); a field not listed here cannot be set."""

    FIELDS = {
        "images_dir_fd": Field(1, INT32, default=-1), "pid": Field(2, INT32),
        "leave_running": Field(3, BOOL), "ext_unix_sk": Field(4, BOOL), "tcp_established": Field(5, BOOL),
        "evasive_devices": Field(6, BOOL), "shell_job": Field(7, BOOL), "file_locks": Field(8, BOOL),
        "log_level": Field(9, INT32, default=2), "log_file": Field(10, STRING),
        "ps": Field(11, MESSAGE, message="criu_page_server_info"), "notify_scripts": Field(12, BOOL),
        "root": Field(13, STRING), "parent_img": Field(14, STRING), "track_mem": Field(15, BOOL),
        "auto_dedup": Field(16, BOOL), "work_dir_fd": Field(17, INT32), "link_remap": Field(18, BOOL),
        "force_irmap": Field(21, BOOL), "exec_cmd": Field(22, STRING, repeated=True),
        "cg_root": Field(25, MESSAGE, repeated=True, message="cgroup_root"),
        "rst_sibling": Field(26, BOOL),
        "inherit_fd": Field(27, MESSAGE, repeated=True, message="inherit_fd"),
        "skip_mnt": Field(31, STRING, repeated=True), "enable_fs": Field(32, STRING, repeated=True),
        "manage_cgroups_mode": Field(34, ENUM), "ghost_limit": Field(35, UINT32, default=0x100000),
        "irmap_scan_paths": Field(36, STRING, repeated=True), "external": Field(37, STRING, repeated=True),
        "empty_ns": Field(38, UINT32),
        "join_ns": Field(39, MESSAGE, repeated=True, message="join_namespace"),
        "freeze_cgroup": Field(44, STRING), "timeout": Field(45, UINT32), "tcp_skip_in_flight": Field(46, BOOL),
        "weak_sysctls": Field(47, BOOL), "lazy_pages": Field(48, BOOL), "status_fd": Field(49, INT32),
        "orphan_pts_master": Field(50, BOOL), "tcp_close": Field(52, BOOL), "cgroup_yard": Field(60, STRING),
        "network_lock": Field(64, ENUM, default=IPTABLES), "images_dir": Field(68, STRING),
        "leave_stopped": Field(69, BOOL), "display_stats": Field(70, BOOL), "log_to_stderr": Field(71, BOOL),
    }


class criu_dump_resp(Message):  # noqa: N801
    FIELDS = {"restored": Field(1, BOOL)}


class criu_restore_resp(Message):  # noqa: N801
    FIELDS = {"pid": Field(1, INT32)}


class criu_notify(Message):  # noqa: N801
    FIELDS = {"script": Field(1, STRING), "pid": Field(2, INT32)}


class criu_features(Message):  # noqa: N801
    FIELDS = {"mem_track": Field(1, BOOL), "lazy_pages": Field(2, BOOL), "pidfd_store": Field(3, BOOL)}


class criu_req(Message):  # noqa: N801
    FIELDS = {"type": Field(1, ENUM), "opts": Field(2, MESSAGE, message="criu_opts"),
              "notify_success": Field(3, BOOL), "keep_open": Field(4, BOOL),
              "features": Field(5, MESSAGE, message="criu_features"), "pid": Field(6, UINT32)}


class criu_version(Message):  # noqa: N801
    FIELDS = {"major_number": Field(1, INT32), "minor_number": Field(2, INT32), "gitid": Field(3, STRING),
              "sublevel": Field(4, INT32), "extra": Field(5, INT32), "name": Field(6, STRING)}


class criu_resp(Message):  # noqa: N801
    FIELDS = {"type": Field(1, ENUM), "success": Field(2, BOOL),
              "dump": Field(3, MESSAGE, message="criu_dump_resp"),
              "restore": Field(4, MESSAGE, message="criu_restore_resp"),
              "notify": Field(5, MESSAGE, message="criu_notify"),
              "ps": Field(6, MESSAGE, message="criu_page_server_info"),
              "cr_errno": Field(7, INT32), "features": Field(8, MESSAGE, message="criu_features"),
              "cr_errmsg": Field(9, STRING), "version": Field(10, MESSAGE, message="criu_version"),
              "status": Field(11, INT32)}


_MESSAGES: dict[str, type[Message]] = {cls.__name__: cls for cls in Message.__subclasses__()}
