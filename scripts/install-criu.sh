#!/usr/bin/env bash
# Leave CRIU >= 4.1 on PATH and pycriu importable in the project's virtualenv.
#
# Debian 12 packages CRIU 3.17, which cannot run on recent kernels (vDSO
# layout), so we build the pinned upstream tarball that Debian's source
# archive serves, with npusnap's patches (scripts/criu-patches/, each says
# why) applied and named as its git id (`criu --version`: GitID: npHASH).
# Idempotent: a good CRIU already installed costs seconds.
#
# usage: scripts/install-criu.sh [VENV]      (VENV defaults to .venv)
set -euo pipefail

VERSION=4.2.1
SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
FALLBACK_VERSION=4.1.1   # trixie's, if sid has moved past $VERSION
FALLBACK_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
PREFIX=${CRIU_PREFIX:-/usr/local}
CACHE=${CRIU_CACHE:-/var/cache/npusnap}
VENV=${1:-.venv}
MIN_MAJOR=4 MIN_MINOR=1

log() { echo "install-criu: $*" >&2; }

PATCHES=$(ls "$(cd "$(dirname "$0")" && pwd)"/criu-patches/*.patch 2>/dev/null | sort || true)
# The patches' fingerprint, built in as CRIU's git id: `criu --version` says which it carries.
MARK=np$(cat $PATCHES /dev/null | sha256sum | cut -c1-8)

good_criu() {  # $1 = binary; true if it is >= 4.1
    local v
    v=$("$1" --version 2>/dev/null | awk '/^Version:/{print $2}') || return 1
    [ -n "$v" ] || return 1
    local major=${v%%.*} rest=${v#*.}
    local minor=${rest%%.*}
    [ "$major" -gt $MIN_MAJOR ] || { [ "$major" -eq $MIN_MAJOR ] && [ "$minor" -ge $MIN_MINOR ]; }
}

build_deps() {
    local pkgs="libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler
        libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev uuid-dev pkg-config
        python3-protobuf xz-utils iproute2 libnftables-dev patch"
    local missing
    missing=$(dpkg-query -W -f='${Package} ${Status}\n' $pkgs 2>/dev/null | awk '!/ installed$/{print $1}'; \
        for p in $pkgs; do dpkg-query -W "$p" >/dev/null 2>&1 || echo "$p"; done)
    if [ -n "$missing" ]; then
        log "installing build dependencies: $(echo $missing | tr '\n' ' ')"
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $pkgs >/dev/null
    fi
}

fetch_tarball() {  # leaves criu_$VERSION.orig.tar.xz (checked) in $CACHE, sets VERSION
    mkdir -p "$CACHE"; cd "$CACHE"
    for pair in "$VERSION:$SHA256:sid" "$FALLBACK_VERSION:$FALLBACK_SHA256:trixie"; do
        local v=${pair%%:*} rest=${pair#*:}
        local sum=${rest%%:*} suite=${rest#*:}
        local tarball="criu_$v.orig.tar.xz"
        if [ ! -f "$tarball" ]; then
            local t uri o
            t=$(mktemp -d); mkdir -p "$t/lists/partial"
            uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
            uri=${uri:-http://deb.debian.org/debian}
            echo "deb-src $uri $suite main" > "$t/sources.list"
            o="-o Dir::Etc::SourceList=$t/sources.list -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists=$t/lists"
            log "fetching $tarball from Debian's source archive ($suite)"
            apt-get $o update -qq >/dev/null 2>&1 || true
            apt-get $o source --download-only "criu=$v-1" >/dev/null 2>&1 || true
            rm -rf "$t"
        fi
        if [ -f "$tarball" ]; then
            echo "$sum  $tarball" | sha256sum -c --quiet - || { log "checksum mismatch for $tarball"; rm -f "$tarball"; exit 1; }
            VERSION=$v; return 0
        fi
    done
    log "could not fetch CRIU source from Debian's source archive"; exit 1
}

ours() {  # $1 = binary; true if it is our build with today's patches
    "$1" --version 2>/dev/null | grep -qx "GitID: $MARK"
}

build_criu() {  # leaves the patched tree in $CACHE/criu-$VERSION-$MARK and installs its criu
    fetch_tarball
    cd "$CACHE"
    local tree=criu-$VERSION-$MARK
    if [ ! -x "$tree/criu/criu" ] || [ ! -d "$tree/lib/pycriu" ]; then
        rm -rf "$tree" "$tree.new" && mkdir "$tree.new"
        tar xf "criu_$VERSION.orig.tar.xz" -C "$tree.new" --strip-components=1
        for p in $PATCHES; do
            patch -d "$tree.new" -p1 --forward --quiet <"$p" || { log "$p does not apply to CRIU $VERSION"; exit 1; }
        done
        mv "$tree.new" "$tree"
        log "building CRIU $VERSION with $(echo $PATCHES | wc -w) patch(es) (about a minute)"
        make -C "$tree" -j"$(nproc)" GITID="$MARK" criu lib >"$CACHE/build-$VERSION.log" 2>&1 \
            || { log "build failed, see $CACHE/build-$VERSION.log"; tail -20 "$CACHE/build-$VERSION.log" >&2; exit 1; }
    fi
    install -D -m 0755 "$tree/criu/criu" "$PREFIX/sbin/criu"
}

cd "$(dirname "$0")/.."
ROOT=$(pwd)
if good_criu "$PREFIX/sbin/criu" && ours "$PREFIX/sbin/criu"; then
    log "CRIU $("$PREFIX/sbin/criu" --version | awk '/^Version:/{print $2}') already at $PREFIX/sbin/criu"
else
    if good_criu "$PREFIX/sbin/criu"; then
        log "CRIU at $PREFIX/sbin/criu lacks npusnap's patches (scripts/criu-patches): rebuilding it"
    fi
    [ "$(id -u)" -eq 0 ] || { log "building and installing CRIU needs root (apt-get, $PREFIX)"; exit 1; }
    build_deps
    build_criu
    cd "$ROOT"
    good_criu "$PREFIX/sbin/criu" && ours "$PREFIX/sbin/criu" \
        || { log "installed CRIU does not report >= $MIN_MAJOR.$MIN_MINOR with $MARK"; exit 1; }
    log "installed CRIU $VERSION at $PREFIX/sbin/criu"
fi

# pycriu: from the same source tree, into the virtualenv.
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c 'import pycriu' 2>/dev/null; then
    src=$(ls -d "$CACHE"/criu-*/lib 2>/dev/null | sort -V | tail -1)
    if [ -z "$src" ] || [ ! -d "$src/pycriu/images" ]; then
        build_deps; build_criu; cd "$ROOT"; src="$CACHE/criu-$VERSION-$MARK/lib"
    fi
    log "installing pycriu into $VENV"
    "$VENV/bin/pip" install -q "$src"
fi
