#!/usr/bin/env python3
"""npusim's stand-in for the AscendC kernel compiler's source step (run by ascendc.cmake).

For one AscendC kernel source it writes, into OUTDIR:

  STEM.device.cpp       the source for npusim's device binary: the AscendC kernels compiled by the
                        host compiler against npusim's kernel_operator.h, each kernel K renamed and
                        called from an npusim kernel `extern "C" void K(npusimKernelCtx *, const
                        void *args, size_t)` (npusim/kernel.h) that unpacks the arguments and turns
                        device addresses into host pointers
  STEM.host.cpp         the host part: the file's functions that launch with <<<...>>>, the launch
                        rewritten to a call of aclrtlaunch_K
  include/aclrtlaunch_K.h   CANN's generated launch header, one per kernel
  STEM.prints           the print buffer each launch of the file's kernels gets (0: they never print)
  STEM.kernels          one kernel a line: its name, then per parameter a tab and NAME|IS_POINTER|HOST_TYPE

`launch OUTDIR NAME BINARY|- STEM...` writes OUTDIR/NAME.launch.cpp: every aclrtlaunch_K of the
library, packing its arguments as aclrtKernelArgsAppend would (each one after the other) and
launching K from the library's embedded binary. A kernel of a stem written -STEM (or of a library
without binary, -) has no npusim implementation: its launch fails with a message saying how to
supply one.

Exit status: 0 written, 2 usage, 3 a source it cannot read.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

KERNEL = re.compile(r'(extern\s+"C"\s+)?((?:__global__|__aicore__)\s+(?:__global__|__aicore__)\s+)void\s+(\w+)\s*\(')
CHEVRON = re.compile(r"\b(\w+)\s*<<<")
TRAP = re.compile(r'\basm\s*(?:volatile\s*)?\(\s*"trap"\s*\)')
PREFIX = "npusim_ascendc_kernel_"


def blank_comments_and_strings(text: str) -> str:
    """The text with comments and string/char literals' contents blanked (same length), for scanning."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [c if c == "\n" else " " for c in text[i:j]]
            i = j
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q:
                j += 2 if text[j] == "\\" else 1
            out[i + 1:j] = " " * (j - i - 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def matching(scan: str, i: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes the one at scan[i]."""
    depth = 0
    for j in range(i, len(scan)):
        if scan[j] == open_:
            depth += 1
        elif scan[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    raise ValueError(f"unbalanced {open_}{close}")


def split_top(text: str) -> list[str]:
    """text split at commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for c in text:
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts]


class Param:
    def __init__(self, decl: str):
        decl = re.sub(r"\s+", " ", decl.split("=")[0]).strip()
        m = re.match(r"(.*?)(\w+)\s*$", decl)
        if not m or not m.group(1).strip():
            raise ValueError(f"cannot read parameter '{decl}'")
        self.type = m.group(1).strip()
        self.name = m.group(2)
        self.pointer = "*" in self.type or self.type.replace("__gm__", "").strip() == "GM_ADDR"

    def host_type(self) -> str:
        return "void *" if self.pointer else self.type.replace("__gm__", "").strip()

    def line(self) -> str:
        return f"{self.name}|{int(self.pointer)}|{self.host_type()}"


def kernels(text: str, scan: str) -> list[tuple[str, list[Param], int, int]]:
    """(name, params, start of the name, end of the parameter list) of each __global__ kernel."""
    found = []
    for m in KERNEL.finditer(scan):
        if "__global__" not in m.group(2):
            continue
        open_ = m.end() - 1
        close = matching(scan, open_, "(", ")")
        params = [Param(p) for p in split_top(text[open_ + 1:close - 1]) if p.strip() not in ("", "void")]
        found.append((m.group(3), params, m.start(3), close))
    return found


def rewrite_launches(text: str, names: set[str]) -> str:
    """K<<<blockDim, l2ctrl, stream>>>(args) -> aclrtlaunch_K(blockDim, stream, args)."""
    out, pos = [], 0
    scan = blank_comments_and_strings(text)
    for m in CHEVRON.finditer(scan):
        if m.start() < pos:
            continue
        end = scan.find(">>>", m.end())
        if end < 0:
            raise ValueError(f"{m.group(1)}<<< without >>>")
        config = split_top(text[m.end():end])
        if len(config) < 3:
            raise ValueError(f"{m.group(1)}<<<...>>> wants blockDim, l2ctrl, stream")
        k = end + 3
        while k < len(scan) and scan[k].isspace():
            k += 1
        if k >= len(scan) or scan[k] != "(":
            raise ValueError(f"{m.group(1)}<<<...>>> is not followed by its arguments")
        j = k + 1
        while scan[j].isspace():
            j += 1
        sep = "" if scan[j] == ")" else ", "
        out.append(text[pos:m.start()])
        out.append(f"aclrtlaunch_{m.group(1)}(({config[0]}), ({config[2]}){sep}")
        pos = k + 1
    out.append(text[pos:])
    return "".join(out)


def host_part(text: str) -> str:
    """The file's #include lines (kernel_operator.h left out) and its top-level functions, in their
    namespaces, that launch with <<<...>>>: what the host code of the library consists of."""
    scan = blank_comments_and_strings(text)
    keep = [line for line in text.splitlines()
            if line.strip().startswith("#include") and "kernel_operator.h" not in line]

    def walk(start: int, end: int) -> list[str]:
        items, head = [], start
        i = start
        while i < end:
            c = scan[i]
            if c == ";":
                head = i + 1
            elif c == "#":  # a preprocessor line is no statement head
                j = scan.find("\n", i)
                i = end if j < 0 else j
                head = i
                continue
            elif c == "{":
                close = matching(scan, i, "{", "}")
                prefix = scan[head:i]
                ns = re.search(r"\bnamespace\b\s*(\w*)\s*$", prefix)
                if ns:
                    inner = walk(i + 1, close - 1)
                    if inner:
                        items.append(text[head:i + 1].strip() + "\n" + "\n".join(inner) + "\n}")
                elif "<<<" in scan[i:close] and "__global__" not in prefix and "__aicore__" not in prefix:
                    items.append(text[head:close].strip())
                i = close
                head = close
                continue
            i += 1
        return items

    return "\n".join(keep) + "\n\n" + "\n\n".join(walk(0, len(scan))) + "\n"


PRINTS = re.compile(r"\b(printf|PRINTF)\s*\(")
PRINT_BYTES = 1 << 20  # a printing kernel's output buffer, per launch


def device_entry(name: str, params: list[Param], prints: bool) -> str:
    lines = [f'extern "C" __attribute__((visibility("default"))) void {name}(npusimKernelCtx *ctx, '
             "const void *args, size_t argsSize) {",
             "  npusim_ascendc::BlockScope scope(ctx);",
             "  size_t off = 0;"]
    for i, p in enumerate(params):
        kind = "pointer" if p.pointer else "value"
        lines.append(f"  auto a{i} = npusim_ascendc::take_{kind}<{p.type}>(ctx, args, argsSize, off);")
    if prints:
        lines.append("  npusim_ascendc::PrintScope prints(ctx, args, argsSize, off);")
    lines.append(f"  {PREFIX}{name}({', '.join(f'a{i}' for i in range(len(params)))});")
    lines.append("}")
    return "\n".join(lines)


def launch_header(name: str, params: list[Param]) -> str:
    guard = f"HEADER_ACLRTLAUNCH_{name.upper()}_H"
    args = "".join(f", {p.host_type()} {p.name}" for p in params)
    return (f"// Generated by npusim's ascendc.cmake from the kernel {name}; do not edit.\n"
            f"#ifndef {guard}\n#define {guard}\n#include <stdint.h>\n#include \"acl/acl_base.h\"\n\n"
            "#ifndef ACLRT_LAUNCH_KERNEL\n"
            "#define ACLRT_LAUNCH_KERNEL(kernel_func) aclrtlaunch_##kernel_func\n#endif\n\n"
            "#ifdef __cplusplus\nextern \"C\" {\n#endif\n"
            f"uint32_t aclrtlaunch_{name}(uint32_t blockDim, aclrtStream stream{args});\n"
            "#ifdef __cplusplus\n}\n#endif\n#endif\n")


def generate(source: Path, outdir: Path, stem: str) -> None:
    text = source.read_text(errors="replace")
    text = TRAP.sub("__builtin_trap()", text)
    scan = blank_comments_and_strings(text)
    found = kernels(text, scan)
    names = {k[0] for k in found}
    (outdir / "include").mkdir(parents=True, exist_ok=True)
    origin = f'#line 1 "{source}"\n'

    renamed, pos = [], 0
    for _name, _params, start, _end in found:
        renamed.append(text[pos:start] + PREFIX)
        pos = start
    renamed.append(text[pos:])
    device = "".join(renamed)
    # Inside the device binary a <<<>>> launch (a host wrapper) is never called: it gets a stub.
    device = re.sub(r"\b\w+\s*<<<[^;]*?>>>\s*\(", "npusim_ascendc::no_launch(", device)
    prints = bool(PRINTS.search(scan))
    entries = "\n\n".join(device_entry(n, p, prints) for n, p, _s, _e in found)
    (outdir / f"{stem}.device.cpp").write_text(
        "// Generated by npusim's ascendc.cmake; do not edit.\n#include \"npusim_ascendc_device.h\"\n"
        + origin + device + "\n\n#line 1 \"npusim entries\"\n" + entries + "\n")

    host = rewrite_launches(host_part(text), names)
    includes = "".join(f'#include "aclrtlaunch_{n}.h"\n' for n in sorted(names))
    (outdir / f"{stem}.host.cpp").write_text(
        "// Generated by npusim's ascendc.cmake; do not edit.\n#include \"npusim_ascendc_host.h\"\n"
        + includes + origin + host)
    for name, params, _s, _e in found:
        (outdir / "include" / f"aclrtlaunch_{name}.h").write_text(launch_header(name, params))
    (outdir / f"{stem}.prints").write_text(str(PRINT_BYTES if prints else 0))
    (outdir / f"{stem}.kernels").write_text(
        "".join(n + "".join("\t" + p.line() for p in ps) + "\n" for n, ps, _s, _e in found))


def launch_source(outdir: Path, lib: str, binary: str, stems: list[str]) -> None:
    body = ["// Generated by npusim's ascendc.cmake; do not edit.", "#include <stddef.h>", "#include <stdint.h>",
            "#include <string.h>", '#include "acl/npusim.h"', ""]
    sym = re.sub(r"\W", "_", lib)
    if binary != "-":
        body += [f"extern \"C\" const unsigned char npusim_bin_{sym}[];",
                 f"extern \"C\" const unsigned char npusim_bin_{sym}_end[];",
                 "__asm__(\".section .rodata\\n.balign 64\\n"
                 f".global npusim_bin_{sym}\\n.hidden npusim_bin_{sym}\\nnpusim_bin_{sym}:\\n"
                 f".incbin \\\"{binary}\\\"\\n"
                 f".global npusim_bin_{sym}_end\\n.hidden npusim_bin_{sym}_end\\nnpusim_bin_{sym}_end:\\n"
                 ".previous\");",
                 f"#define NPUSIM_BIN npusim_bin_{sym}",
                 f"#define NPUSIM_BIN_SIZE ((size_t)(npusim_bin_{sym}_end - npusim_bin_{sym}))", ""]
    else:
        body += ["#define NPUSIM_BIN ((const unsigned char *)0)", "#define NPUSIM_BIN_SIZE ((size_t)0)", ""]
    for stem in stems:
        implemented = not stem.startswith("-")
        stem = stem.lstrip("-")
        print_bytes = (outdir / f"{stem}.prints").read_text().strip()
        for line in (outdir / f"{stem}.kernels").read_text().splitlines():
            name, *fields = line.split("\t")
            params = [f.split("|") for f in fields if f]
            decl = "".join(f", {t} {n}" for n, _ptr, t in params)
            body.append(f'extern "C" __attribute__((visibility("default"))) '
                        f"uint32_t aclrtlaunch_{name}(uint32_t blockDim, aclrtStream stream{decl}) {{")
            size = " + ".join(f"sizeof({n})" for n, _p, _t in params) or "0"
            body.append(f"  unsigned char args[{size} + 1];")
            body.append("  size_t off = 0;")
            for n, _p, _t in params:
                body.append(f"  memcpy(args + off, &{n}, sizeof({n})); off += sizeof({n});")
            binary_args = "NPUSIM_BIN, NPUSIM_BIN_SIZE" if implemented else "(const unsigned char *)0, 0"
            body.append(f'  return (uint32_t)npusimAscendcLaunch("{lib}", "{name}", {binary_args}, '
                        f"blockDim, stream, args, off, {print_bytes});")
            body.append("}")
            body.append("")
    (outdir / f"{lib}.launch.cpp").write_text("\n".join(body))


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 4 and argv[0] == "gen":
            generate(Path(argv[1]), Path(argv[2]), argv[3])
            return 0
        if len(argv) >= 4 and argv[0] == "launch":
            launch_source(Path(argv[1]), argv[2], argv[3], argv[4:])
            return 0
    except OSError as e:
        print(f"npusim_ascendc: {e}", file=sys.stderr)
        return 3
    except ValueError as e:
        print(f"npusim_ascendc: {argv[1]}: {e}", file=sys.stderr)
        return 3
    print("usage: npusim_ascendc.py gen SOURCE OUTDIR STEM | launch OUTDIR LIBRARY BINARY|- STEM...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
