#!/bin/sh
# Installs what the cross builds of scripts/test-cross.sh need (issue 20):
#  - on the host, from Debian 12: the cross compilers for s390x (big-endian,
#    64-bit) and armhf (32-bit; i686 with FKVF_CROSS_ARCHES=i386), each with
#    its C library, and qemu user-mode emulation (qemu-user);
#  - for each target, the libraries that libfkvf, its tests and the CLI link
#    (zlib, xxHash, Check, libarchive, libcurl and what they depend on), as
#    Debian's own packages of that architecture, unpacked (dpkg -x) into a
#    sysroot under build-deps/cross/ (ignored by git), not installed.
# Why unpacked and not installed as multiarch packages: a multiarch library
# must have the same version in every architecture, and Debian's security
# archive carries no s390x, so zlib1g:s390x cannot match the host's updated
# zlib1g; the unpacked packages never meet the host's.
# Run as root (or with sudo) for the host packages. Idempotent: quiet when
# everything is there. The sysroots take about 70 MB each.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${FKVF_CROSS_DIR:-$ROOT/build-deps/cross}
# Debian architectures to set up (FKVF_CROSS_ARCHES: a subset, or armhf)
ARCHES=${FKVF_CROSS_ARCHES:-s390x armhf}
HOST_PKGS="qemu-user"
for a in $ARCHES; do
    case $a in
        s390x) HOST_PKGS="$HOST_PKGS gcc-s390x-linux-gnu libc6-dev-s390x-cross" ;;
        i386) HOST_PKGS="$HOST_PKGS gcc-i686-linux-gnu libc6-dev-i386-cross" ;;
        armhf) HOST_PKGS="$HOST_PKGS gcc-arm-linux-gnueabihf libc6-dev-armhf-cross" ;;
        *) echo "install-cross-deps: unknown architecture $a (s390x, i386, armhf)" >&2; exit 2 ;;
    esac
done
TARGET_LIBS="zlib1g-dev libxxhash-dev check libsubunit-dev libarchive-dev libcurl4-openssl-dev"
# The C library, kernel headers and compiler runtime come with the cross
# compiler (/usr/<triplet>); programs of the dependency closure are not needed.
SKIP="libc6 libc6-dev libc-dev-bin linux-libc-dev libcrypt-dev libnsl-dev libtirpc-dev
      libtirpc-common gcc-12-base mawk rpcsvc-proto"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

updated=0
apt_update() { [ $updated -eq 1 ] || { $SUDO apt-get update -q >/dev/null; updated=1; }; }
added=0
for a in $ARCHES; do
    if ! dpkg --print-foreign-architectures | grep -qx "$a"; then
        $SUDO dpkg --add-architecture "$a"
        added=1
    fi
done
# the new architectures' package lists, once for all of them
[ $added -eq 0 ] || apt_update
missing=""
for p in $HOST_PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    apt_update
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -q --no-install-recommends $missing
fi

for a in $ARCHES; do
    sysroot=$DIR/sysroot-$a
    # the package closure, with the versions apt would fetch today
    list=""
    for p in $TARGET_LIBS; do list="$list $p:$a"; done
    # shellcheck disable=SC2086
    closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
                  --no-breaks --no-replaces --no-enhances $list 2>/dev/null |
              sed -n "s/^\([a-z0-9][a-z0-9.+-]*\):$a\$/\1/p" | sort -u)
    names=""
    for p in $closure; do
        case " $(echo $SKIP) " in *" $p "*) continue ;; esac
        names="$names $p:$a"
    done
    # one apt-cache call for all (each call reads every package list)
    # shellcheck disable=SC2086
    want=$(echo "sysroot layout 2"; apt-cache policy $names | awk '/^[^ ]/ { p = $1; sub(/:$/, "", p) }
                                           /^  Candidate:/ { print p "=" $2 }')
    if [ -f "$sysroot/.packages" ] && [ "$(cat "$sysroot/.packages")" = "$want" ]; then
        echo "install-cross-deps: $a sysroot present ($(echo "$want" | grep -c =) packages)"
        continue
    fi
    echo "install-cross-deps: unpacking $(echo "$want" | grep -c =) $a packages into $sysroot"
    rm -rf "$sysroot" "$DIR/debs-$a"
    mkdir -p "$sysroot" "$DIR/debs-$a"
    # shellcheck disable=SC2086
    # (as root, apt would hand the download to its sandbox user, who cannot
    # write here)
    sandbox=""
    [ "$(id -u)" -ne 0 ] || sandbox="-o APT::Sandbox::User=root"
    # shellcheck disable=SC2086
    (cd "$DIR/debs-$a" && apt-get download -q $sandbox $(echo "$want" | grep =) >/dev/null)
    for d in "$DIR/debs-$a"/*.deb; do dpkg -x "$d" "$sysroot"; done
    # absolute links (libz.so -> /lib/<triplet>/libz.so.1...) point into
    # the sysroot instead, relative to where they are
    find "$sysroot" -type l -lname '/*' | while read -r l; do
        ln -sfnr "$sysroot$(readlink "$l")" "$l"
    done
    rm -rf "$DIR/debs-$a"
    printf '%s\n' "$want" > "$sysroot/.packages"
done
