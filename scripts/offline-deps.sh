#!/usr/bin/env bash
# offline-deps.sh: the Debian packages the build needs, carried to a machine
# that reaches no package archive (a GPU node behind a firewall, say).
#
#   there:  cp /var/lib/dpkg/status target.status             (what it has)
#   here:   scripts/offline-deps.sh download DIR target.status (needs apt)
#   there:  scripts/offline-deps.sh install DIR                (as root)
#
# download asks apt's own resolver what installing the packages of
# install-deps.sh would add to the target (its dpkg status file in place of
# this machine's), fetches exactly those .deb files into DIR and lists them
# in DIR/list.txt. install runs dpkg on them; both machines must run the
# same Debian release and architecture (download records them, install
# checks). `list target.status` prints what download would fetch.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

usage() {
    echo "usage: offline-deps.sh download DIR STATUS | list STATUS | install DIR" >&2
    echo "  STATUS: the target's /var/lib/dpkg/status, copied here" >&2
    exit 2
}

# the packages install-deps.sh installs, read from it (one list to keep)
wanted() {
    sed -n 's/^pkgs=(\(.*\))$/\1/p' "$here/install-deps.sh" | head -1
}

release() { echo "$(. /etc/os-release && echo "$ID $VERSION_ID") $(dpkg --print-architecture)"; }

# what apt would install on a machine whose dpkg status is $1
closure() {
    local pkgs out
    pkgs=$(wanted)
    [ -n "$pkgs" ] || { echo "offline-deps: no pkgs=(...) line in install-deps.sh" >&2; exit 1; }
    # shellcheck disable=SC2086
    out=$(apt-get -s -q -o Dir::State::status="$1" --no-install-recommends install $pkgs 2>&1) || {
        echo "offline-deps: error: apt cannot resolve the packages for that machine: $(echo "$out" | grep '^E:' | head -1); hint: apt-get update here, or check that STATUS is a dpkg status file" >&2
        exit 2
    }
    echo "$out" | awk '/^Inst /{print $2}'
}

check_status() {
    [ -f "$1" ] && grep -q '^Package: ' "$1" || {
        echo "offline-deps: error: $1 is not a dpkg status file; hint: copy the target's /var/lib/dpkg/status here" >&2
        exit 2
    }
}

command -v apt-cache >/dev/null || { echo "offline-deps: error: apt-cache not found: this is for Debian and its derivatives" >&2; exit 2; }

case ${1:-} in
  list)
    [ $# -eq 2 ] || usage
    check_status "$2"
    closure "$2"
    ;;
  download)
    [ $# -eq 3 ] || usage
    dir=$2
    check_status "$3"
    if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
        echo "offline-deps: error: $dir is not empty; hint: give a new folder" >&2; exit 2
    fi
    mkdir -p "$dir"
    closure "$3" > "$dir/list.txt"
    release > "$dir/release.txt"
    n=$(wc -l < "$dir/list.txt")
    if [ "$n" -eq 0 ]; then echo "offline-deps: that machine has every package already"; exit 0; fi
    echo "offline-deps: downloading $n packages into $dir"
    # shellcheck disable=SC2046
    sandbox=(); [ "$(id -u)" -ne 0 ] || sandbox=(-o APT::Sandbox::User=root)  # root may write DIR, _apt may not
    (cd "$dir" && apt-get download -q "${sandbox[@]}" $(cat list.txt) >/dev/null)
    echo "offline-deps: $(ls "$dir"/*.deb | wc -l) .deb files, $(du -sh "$dir" | cut -f1); bring $dir there and run: scripts/offline-deps.sh install $dir"
    ;;
  install)
    [ $# -eq 2 ] || usage
    dir=$2
    [ -f "$dir/release.txt" ] || { echo "offline-deps: error: $dir has no release.txt; hint: make it with offline-deps.sh download" >&2; exit 2; }
    if [ "$(cat "$dir/release.txt")" != "$(release)" ]; then
        echo "offline-deps: error: the packages are for $(cat "$dir/release.txt"), this machine runs $(release); hint: download them on a machine of the same release" >&2; exit 2
    fi
    [ "$(id -u)" -eq 0 ] || { echo "offline-deps: error: dpkg needs root; hint: sudo scripts/offline-deps.sh install $dir" >&2; exit 2; }
    dpkg -i "$dir"/*.deb >/dev/null
    echo "offline-deps: installed $(ls "$dir"/*.deb | wc -l) packages; now: make && make test"
    ;;
  -h|--help) usage ;;
  *) usage ;;
esac
