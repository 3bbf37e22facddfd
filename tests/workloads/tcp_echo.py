"""A TCP echo client for network-lock tests: connects to 127.0.0.1:PORT, says "ready",
then sends back every line it reads, prefixed with "echo ", until the peer closes."""

import socket
import sys

sk = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
f = sk.makefile("rwb", buffering=0)
f.write(b"ready\n")
for line in f:
    f.write(b"echo " + line)
