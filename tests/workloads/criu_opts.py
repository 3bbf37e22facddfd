"""Workloads that need one CRIU option each (tests/integration/test_criu_options.py).

    criu_opts.py ghost PATH SIZE   a SIZE-byte file, open and deleted; prints "ok N" while its contents hold
    criu_opts.py remap PATH        PATH open, linked to PATH.link, PATH unlinked; prints "same N" while the
                                   open file is PATH.link's inode
    criu_opts.py dgram PATH        a datagram socket connected to PATH (the test's); sends "tick N"
    criu_opts.py tcp PORT          connects to 127.0.0.1:PORT; echoes every line back as "echo LINE"
    criu_opts.py fd N              the same over the stream socket on fd N
    criu_opts.py waitclose PORT    connects to 127.0.0.1:PORT and prints "closed" once the connection ends
    criu_opts.py inotify DIR       an inotify watch on DIR; prints "event N" while it sees DIR/f created
    criu_opts.py tick -            nothing needed: prints "tick N" (for namespaces and cgroups)

Each prints "ready" first, and one line every 50 ms where it loops.
"""

import os
import socket
import sys
import time


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def ticks(check):  # type: ignore[no-untyped-def]
    n = 0
    while True:
        say(check(n))
        n += 1
        time.sleep(0.05)


def echo(sk: socket.socket) -> None:
    f = sk.makefile("rwb", buffering=0)
    f.write(b"ready\n")
    say("ready")
    for line in f:
        f.write(b"echo " + line)


mode, arg = sys.argv[1], sys.argv[2]
if mode == "ghost":
    size = int(sys.argv[3])
    pattern = bytes(range(256)) * (size // 256)
    fd = os.open(arg, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, pattern)
    os.unlink(arg)
    say("ready")
    ticks(lambda n: f"ok {n}" if os.pread(fd, len(pattern), 0) == pattern else f"bad {n}")
elif mode == "remap":
    fd = os.open(arg, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.link(arg, arg + ".link")
    os.unlink(arg)
    say("ready")
    ticks(lambda n: f"same {n}" if os.fstat(fd).st_ino == os.stat(arg + ".link").st_ino else f"differ {n}")
elif mode == "dgram":
    sk = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sk.connect(arg)
    say("ready")

    def tick(n: int) -> str:
        sk.send(f"tick {n}".encode())
        return f"sent {n}"

    ticks(tick)
elif mode == "tcp":
    echo(socket.create_connection(("127.0.0.1", int(arg))))
elif mode == "fd":
    echo(socket.socket(fileno=int(arg)))
elif mode == "waitclose":
    sk = socket.create_connection(("127.0.0.1", int(arg)))
    say("ready")
    try:
        while sk.recv(4096):
            pass
    except OSError:
        pass
    say("closed")
    ticks(lambda n: f"after {n}")
elif mode == "inotify":
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ify = libc.inotify_init1(os.O_NONBLOCK)
    if ify < 0 or libc.inotify_add_watch(ify, arg.encode(), 0x100) < 0:  # IN_CREATE
        raise OSError(ctypes.get_errno(), "inotify")
    say("ready")

    def event(n: int) -> str:
        path = os.path.join(arg, "f")
        open(path, "w").close()
        os.unlink(path)
        time.sleep(0.01)
        try:
            seen = len(os.read(ify, 4096)) > 0
        except BlockingIOError:
            seen = False
        return f"event {n}" if seen else f"missed {n}"

    ticks(event)
elif mode == "tick":
    say("ready")
    ticks(lambda n: f"tick {n}")
