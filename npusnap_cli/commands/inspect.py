from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..output import Terminal, human_bytes
from . import json_option

if TYPE_CHECKING:
    from rich.tree import Tree

    from ..image.inspection import Inspection, MemoryInfo, ProcessInfo

LARGEST_IMAGES = 8   # image files listed one by one in the tree (--json lists them all)


@click.command()
@click.argument("directory", type=click.Path(path_type=Path))
@json_option
@click.pass_obj
def inspect(term: Terminal, directory: Path) -> None:
    """Show what checkpoint DIRECTORY holds: processes, threads, memory, files,
    sockets, device state, phase timings and image sizes.

    Only reads: nothing in DIRECTORY is executed and no symlink in it is followed.
    """
    from ..image.inspection import inspect as read_checkpoint

    result = read_checkpoint(directory)
    if term.json_mode:
        term.data("inspect", result.to_dict())
    else:
        term.render(render_tree(result))


# ---------------------------------------------------------------- the human view


def render_tree(ins: Inspection) -> Tree:
    from rich.tree import Tree

    root = Tree(_t(f"[bold]Checkpoint[/bold] {_clean(ins.directory)}"))
    root.add(_t(f"created {_clean(ins.created)} on {_clean(ins.host)} "
                f"(kernel {_clean(ins.kernel)})"))
    root.add(_t(f"npusnap {_clean(ins.npusnap_version)}, CRIU {_clean(ins.criu_version)}, "
                f"format {ins.format_version}"))
    root.add(_t(f"pid {ins.pid}" + ("" if any(p.command for p in ins.processes)
                                     else f": {_clean(_command(ins.command)) or '?'}")))
    if ins.options:
        opts = ", ".join(f"{_clean(str(k))}={_clean(_fmt_opt(v))}" for k, v in ins.options.items())
        root.add(_t(f"options: {opts}"))

    procs = root.add(_t(f"[bold]Processes[/bold] ({len(ins.processes)}, "
                        f"{human_bytes(ins.memory_dumped)} of memory dumped)"))
    known = {p.pid for p in ins.processes}
    children: dict[int, list[ProcessInfo]] = {}
    for p in ins.processes:
        children.setdefault(p.ppid if p.ppid in known and p.ppid != p.pid else -1, []).append(p)

    shown: set[int] = set()
    # depth-first without recursion; processes in a ppid cycle (a damaged pstree) go on top
    stack = [(procs, p) for p in reversed(ins.processes)]          # popped last: the leftovers
    stack += [(procs, p) for p in reversed(children.get(-1, []))]  # popped first: the roots
    while stack:
        parent, proc = stack.pop()
        if proc.pid in shown:
            continue
        shown.add(proc.pid)
        node = _process(parent, proc)
        stack.extend((node, c) for c in reversed(children.get(proc.pid, [])))

    _members(root, ins)
    _device(root, ins)
    phases = root.add(_t("[bold]Phases[/bold]"))
    for ph in ins.phases:
        line = f"{_clean(ph.name)}: {ph.seconds:.3f}s"
        if ph.bytes > 0:
            line += f", {human_bytes(ph.bytes)}"
            if ph.throughput:
                line += f" ({human_bytes(ph.throughput)}/s)"
        phases.add(_t(line))

    images = root.add(_t(f"[bold]Images[/bold]: {human_bytes(ins.images.total)} in "
                         f"{len(ins.images.files)} files"
                         + "".join(f", {_clean(d)}/ {human_bytes(n)}"
                                   for d, n in sorted(ins.images.by_directory.items()))))
    hp = ins.host_pages
    if hp:
        images.add(_t(f"host pages in the chunk store {_clean(str(hp.get('store')))}: "
                      f"{human_bytes(_num(hp.get('new_bytes')))} new (codec {_clean(str(hp.get('codec')))}), "
                      f"{human_bytes(_num(hp.get('referenced_bytes')))} referenced (stored before), "
                      f"of {human_bytes(_num(hp.get('raw_bytes')))}"))
    di = ins.device_images
    if di:
        images.add(_t(f"device images in the chunk store: {human_bytes(_num(di.get('raw_bytes')))} raw, "
                      f"{human_bytes(_num(di.get('new_bytes')))} stored (codec {_clean(str(di.get('codec')))}), "
                      f"{human_bytes(_num(di.get('referenced_bytes')))} referenced (stored before)"
                      + (f", {human_bytes(_num(di.get('plain_bytes')))} left as plain files (compressing did not pay)"
                         if di.get("plain_bytes") else "")
                      + _auto_verdict(di)))
    largest = sorted(ins.images.files, key=lambda f: (-f.size, f.path))
    for f in largest[:LARGEST_IMAGES]:
        images.add(_t(f"{_clean(f.path)}  {human_bytes(f.size)}"))
    if len(largest) > LARGEST_IMAGES:
        more = len(largest) - LARGEST_IMAGES
        images.add(_t(f"[dim]… {more} smaller files (--json lists all)[/dim]"))

    for note in ins.notes:
        root.add(_t(f"[yellow]note:[/yellow] {_clean(note)}"))
    return root


def _num(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _auto_verdict(di: dict[str, object]) -> str:
    """--compress auto: which way it went, and whether by a verdict remembered in the store from an
    earlier checkpoint or by this checkpoint's own probe (the first here writes its images plain,
    and what its probe found is for the next)."""
    if di.get("compress") != "auto":
        return ""
    if di.get("verdict") == "remembered":
        way = "plain wins here" if di.get("plain_bytes") else "compressing pays here"
        return f"; auto: {way} (remembered from an earlier checkpoint)"
    if di.get("verdict") == "probed":
        way = "written plain" if di.get("plain_bytes") else "compressed"
        found = "compressing pays here" if di.get("pays") else "plain wins here"
        return f"; auto: {way}, probed by this checkpoint ({found})"
    return ""


def _process(parent: Tree, p: ProcessInfo) -> Tree:
    head = f"[bold]{p.pid}[/bold] {_clean(p.comm) or '?'}"
    facts = [f"ppid {p.ppid}"]
    if p.state and p.state != "alive":
        facts.append(p.state)
    node = parent.add(_t(f"{head} ({', '.join(facts)})"))
    if p.command:
        node.add(_t(f"command: {_clean(_command(p.command))}"))
    if p.exe:
        node.add(_t(f"exe: {_clean(p.exe)}"))
    if p.cwd:
        node.add(_t(f"cwd: {_clean(p.cwd)}"))
    tids = ", ".join(f"{t.tid}" + (f" {_clean(t.comm)}" if t.comm and t.comm != p.comm else "")
                     for t in p.threads)
    node.add(_t(f"threads ({len(p.threads)}): {tids}"))
    if p.memory is not None:
        _memory(node, p.memory)
    if p.files:
        files = node.add(_t(f"files ({len(p.files)})"))
        for f in p.files:
            kind = "" if f.type == "reg" else f" [dim]({_clean(f.type)})[/dim]"
            access = f" [dim]{f.access}[/dim]" if f.access else ""
            files.add(_t(f"{f.fd}: {_clean(f.path)}{kind}{access}"))
    if p.sockets:
        socks = node.add(_t(f"sockets ({len(p.sockets)})"))
        for s in p.sockets:
            desc = " ".join(x for x in (s.family, s.type, s.state) if x)
            where = _clean(s.local) or "(unnamed)"
            peer = f" → {_clean(s.peer)}" if s.peer else ""
            socks.add(_t(f"{s.fd}: {_clean(desc)} {where}{peer}"))
    return node


def _memory(parent: Tree, m: MemoryInfo) -> None:
    line = (f"memory: {human_bytes(m.dumped)} dumped of {human_bytes(m.mapped)} mapped "
            f"in {m.vmas} mappings")
    if m.in_parent:
        line += f", {human_bytes(m.in_parent)} in the parent checkpoint"
    node = parent.add(_t(line))
    for k in m.kinds:
        node.add(_t(f"{k.kind}: {human_bytes(k.dumped)} dumped, {human_bytes(k.mapped)} mapped "
                    f"({k.vmas} {'mapping' if k.vmas == 1 else 'mappings'})"))


def _members(root: Tree, ins: Inspection) -> None:
    """A process set: each member's size, checksum, device and phases."""
    if not ins.members:
        return
    node = root.add(_t(f"[bold]Set[/bold] of {len(ins.members)} processes"))
    for m in ins.members:
        dev = m["device"]
        member = node.add(_t(f"[bold]{m['pid']}[/bold]: {_clean(_command(m['command'])) or '?'}"))
        member.add(_t(f"{m['processes']} processes, {human_bytes(m['bytes'])} in {m['files']} files, "
                      f"checksum {_clean(m['checksum'])}"))
        member.add(_t(f"device: {_clean(str(dev['backend']))}"
                      + (f" {', '.join(str(x) for x in dev['devices'])}" if dev["devices"] else "")
                      + f", {human_bytes(dev['bytes'])} ({_clean(str(dev['method']))})"))
        member.add(_t("phases: " + ", ".join(f"{_clean(p['name'])} {p['seconds']:.3f}s" for p in m["phases"])))


def _device(root: Tree, ins: Inspection) -> None:
    from ..backends import BackendName

    d = ins.device
    if d.backend == BackendName.NONE:
        root.add(_t("[bold]Device[/bold]: none"))
        return
    devices = ", ".join(str(x) for x in d.devices) or "none"
    node = root.add(_t(f"[bold]Device[/bold]: {_clean(str(d.backend))}"
                       + (f" ({_clean(str(d.runtime))})" if d.runtime else "")))
    node.add(_t(f"devices: {_clean(devices)}"))
    node.add(_t(f"allocations: {d.allocations}, {human_bytes(d.bytes)}"))
    if d.resources:  # each resource kind the snapshot carried, with its count
        node.add(_t("resources: " + ", ".join(f"{_clean(k)} {n}" for k, n in d.resources.items())))
    node.add(_t(f"method: {_clean(str(d.method))}"))
    c = ins.chain
    if c.parent is not None:
        node.add(_t(f"incremental: {human_bytes(c.device_new)} new, {human_bytes(c.device_referenced)} "
                    f"referenced in the parent chain (parent {_clean(c.parent)})"))


# ---------------------------------------------------------------- helpers


def _t(markup: str) -> Any:
    """Our own markup only: every value from the directory went through _clean first.

    Long lines fold instead of being cropped at the console's width (a tree crops
    what does not fit, and a path cut short is worse than a path on two lines)."""
    from rich.text import Text

    text = Text.from_markup(markup, overflow="fold")
    text.no_wrap = False
    return text


def _clean(text: str) -> str:
    """A value read from the checkpoint, safe to print: control characters shown
    escaped (no terminal escape sequences get through) and rich markup escaped."""
    from rich.markup import escape

    from ..output import shown

    return escape(shown(text))


def _command(argv: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(a) for a in argv)


def _fmt_opt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
