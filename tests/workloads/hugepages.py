"""A process whose memory is madvised MADV_HUGEPAGE: 32 MiB of a pattern, its digest printed with
"ready"; once the file named by argv[1] exists it prints the digest again and exits.
usage: hugepages.py CHECK_FILE"""

import hashlib
import mmap
import os
import sys
import time

SIZE = 32 << 20
mem = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
mem.madvise(mmap.MADV_HUGEPAGE)
block = hashlib.sha512(b"huge").digest() * (4096 // 64)
for offset in range(0, SIZE, 4096):
    mem[offset:offset + 4096] = block[offset // 4096 % 64:] + block[:offset // 4096 % 64]
print("ready", hashlib.blake2b(mem, digest_size=8).hexdigest(), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print("digest", hashlib.blake2b(mem, digest_size=8).hexdigest(), flush=True)
