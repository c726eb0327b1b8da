#!/usr/bin/env bash
# cluster.sh: an emulated cluster on one machine, so that a run across hosts
# can be tested and its communication costs something. Each host is a network
# namespace with a host name of its own; every host has one NIC (a veth pair)
# into a switch (a bridge in a namespace of its own), both directions shaped
# with tc. Open MPI reaches the hosts through an rsh agent that enters a
# host's namespace, as ssh would enter a real node.
#
#   cluster.sh up N [--link RATE] [--delay TIME] [--loss PCT] [--slots S]
#   cluster.sh run -- mpirun -np 4 ./zero3 --model small
#   cluster.sh status
#   cluster.sh down
#
# Only root can make namespaces. Addresses are 10.231.0.0/24 (host i is
# 10.231.0.(i+1)); they exist only inside the namespaces made here, and the
# machine's own interfaces and routes are left alone.
set -euo pipefail

PREFIX=zw                         # every namespace made here is zw-*
SWITCH=$PREFIX-switch
SUBNET=10.231.0
STATE=${ZW_CLUSTER_DIR:-/tmp/zw-cluster}  # hostfile, agent, settings
# written by up as it makes the folder: down removes only a folder that holds it
MARKER=.made-by-cluster
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STOP_WAIT_S=30                    # for a run given SIGTERM to end, before SIGKILL

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    cat <<'EOF'
Options of up:
  --link RATE    each NIC's rate in both directions, tc's units (default 1gbit)
  --delay TIME   one-way delay host to host, e.g. 100us (needs the kernel's netem)
  --loss PCT     packets lost on the way out of a host, percent (needs netem)
  --slots S      ranks per host in the hostfile (default 2)
run: runs the command in node0's namespace, in the folder it is called from,
with the hostfile and the agent set for Open MPI (mpirun -np 4 needs no
--hostfile) and scripts/mpi-env.sh's settings and mpirun (root allowed; a
rank killed by a signal, or a program that cannot be started, named in one
line). SIGTERM or SIGHUP to it is passed on to the run's mpirun, which stops
every rank with it; anything of the run still alive in the cluster when it
ends (or STOP_WAIT_S = 30 s after such a signal) is killed.
status: exit 1 when a host of the cluster is gone (cluster.sh down, then up).
down: removes the namespaces, their links and the folder; only a folder up
made (it holds the file .made-by-cluster), else it refuses and touches nothing.
Exit status: 0 done; 1 the cluster is damaged (status); 2 bad use, or a
cluster is already up (up) or none is (run), or the folder is not one up
made; 3 this machine cannot make the cluster (not root, no namespaces, ...);
run: the command's own, or 128 + the signal that stopped it.
EOF
}

say() { echo "cluster: $*"; }
die() { echo "cluster: error: $1" >&2; exit "${2:-2}"; }

# Is the folder one that up made? (Anything else named by ZW_CLUSTER_DIR is
# someone's: never run its agent, never remove it.)
ours() { [ -f "$STATE/$MARKER" ]; }
not_ours() {
    die "$STATE was not made by cluster.sh up (no $MARKER in it), so it is left alone; ZW_CLUSTER_DIR names this script's folder: unset it, or name one that does not exist yet"
}

node_ns() { echo "$PREFIX-node$1"; }
our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-(node[0-9]+|switch)$" || true; }

# tc rate/time syntax, so a typo is one line here and not tc's
check_rate() {
    [[ $1 =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit)$ ]] && awk -v r="$1" 'BEGIN{exit !(r + 0 > 0)}' ||
        die "--link $1: give a rate above 0 in tc's units, e.g. 1gbit or 100mbit"
}
check_time() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || die "--delay $1: give a time with its unit, e.g. 100us or 1ms"; }
check_loss() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?%?$ ]] && awk -v p="${1%\%}" 'BEGIN{exit !(p < 100)}' || die "--loss $1: give a percentage below 100, e.g. 0.1"; }

# What `up` needs of the machine; the reason why not, exit 3.
check_machine() {
    [ "$(id -u)" -eq 0 ] || die "namespaces need root (run as root, or skip the multi-host tests)" 3
    local tool
    for tool in ip tc unshare hostname; do
        command -v $tool >/dev/null || die "$tool not found (scripts/install-deps.sh installs iproute2 and util-linux)" 3
    done
    local probe=$PREFIX-probe$$
    ip netns add "$probe" 2>/dev/null || die "cannot make a network namespace here (a container without CAP_SYS_ADMIN?)" 3
    ip netns del "$probe"
}

# Does the kernel have netem (sch_netem)? Tried on a dummy link in the switch.
have_netem() {
    ip netns exec "$SWITCH" ip link add zw-netem type dummy 2>/dev/null || return 1
    local ok=1
    ip netns exec "$SWITCH" tc qdisc add dev zw-netem root netem delay 1us 2>/dev/null && ok=0
    ip netns exec "$SWITCH" ip link del zw-netem
    return $ok
}

# A NIC's egress: tbf at the link rate; with a delay or loss, netem first
# and tbf below it. tbf's bucket holds 1 ms at the rate (at least 3 full
# frames), so a message longer than that leaves at the rate, as from a real
# NIC. Its queue holds 200 ms at the rate (at least 4 MB): a sending host's
# own queue should push back on TCP, not drop what it sends.
shape() {
    local ns=$1 dev=$2 rate=$3 delay=$4 loss=$5
    local tbf=(tbf rate "$rate" burst "$(rate_bytes "$rate" 0.001 4542)" limit "$(rate_bytes "$rate" 0.2 4194304)")
    if [ -n "$delay$loss" ]; then
        local netem=(netem limit 100000)
        [ -n "$delay" ] && netem+=(delay "$delay")
        [ -n "$loss" ] && netem+=(loss "${loss%\%}%")
        ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: "${netem[@]}"
        ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: "${tbf[@]}"
    else
        ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: "${tbf[@]}"
    fi
}

# rate_bytes RATE SECONDS MIN: the bytes RATE (tc's units) moves in SECONDS, at least MIN
rate_bytes() {
    awk -v r="$1" -v s="$2" -v least="$3" 'BEGIN {
        n = r + 0; u = substr(r, length(n "") + 1)
        m = (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : (u == "gbit") ? 1e9 : (u == "tbit") ? 1e12 : 1
        b = int(n * m / 8 * s); if (b < least) b = least; print b }'
}

cmd_down() {
    [ ! -e "$STATE" ] || ours || not_ours
    local ns pid
    for ns in $(our_namespaces); do
        # what still runs in a namespace keeps it (and its links) alive
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
    # (also the hosts file of a namespace someone deleted)
    local dir
    for dir in /etc/netns/"$PREFIX"-*; do
        [[ ${dir##*/} =~ ^$PREFIX-(node[0-9]+|switch)$ ]] && rm -rf "$dir"
    done
    rm -rf "$STATE"
}

cmd_up() {
    local n=${1:-}
    [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "up N: give a number of hosts, 1 to 200"
    shift
    local rate=1gbit delay="" loss="" slots=2
    while [ $# -gt 0 ]; do
        case $1 in
            --link) rate=${2:-}; check_rate "$rate"; shift 2 ;;
            --delay) delay=${2:-}; check_time "$delay"; shift 2 ;;
            --loss) loss=${2:-}; check_loss "$loss"; shift 2 ;;
            --slots) slots=${2:-}; [[ $slots =~ ^[1-9][0-9]*$ ]] || die "--slots $slots: give a positive number"; shift 2 ;;
            *) die "up: unknown option $1 (see cluster.sh --help)" ;;
        esac
    done
    [ ! -e "$STATE" ] || ours || not_ours
    [ -z "$(our_namespaces)" ] || die "a cluster is already up ($(our_namespaces | grep -c node) hosts; cluster.sh down removes it)"
    check_machine
    rm -rf "$STATE"   # (ours, of a cluster whose namespaces are gone)
    mkdir -m 0755 "$STATE" 2>/dev/null || die "cannot make the folder $STATE (ZW_CLUSTER_DIR): name a new folder inside one that exists"
    echo "made by scripts/cluster.sh up; cluster.sh down removes this folder" > "$STATE/$MARKER"
    # from here a failure (set -e), or an interruption, takes down whatever was made
    trap 'echo "cluster: error: up failed; removing what it made" >&2; cmd_down' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    ip netns add "$SWITCH"
    ip -n "$SWITCH" link add br0 type bridge
    ip -n "$SWITCH" link set br0 up
    if [ -n "$delay$loss" ] && ! have_netem; then
        trap - EXIT
        cmd_down
        die "--delay and --loss need the kernel's netem qdisc (sch_netem), which this kernel lacks; shape the rate alone (--link)" 3
    fi
    local i ns hosts="127.0.0.1 localhost"$'\n'
    for ((i = 0; i < n; i++)); do hosts+="$SUBNET.$((i + 1)) node$i"$'\n'; done
    : > "$STATE/hostfile"
    for ((i = 0; i < n; i++)); do
        ns=$(node_ns $i)
        ip netns add "$ns"
        # `ip netns exec` binds /etc/netns/NS/hosts over /etc/hosts: the names resolve in every host
        mkdir -p "/etc/netns/$ns"
        printf '%s' "$hosts" > "/etc/netns/$ns/hosts"
        ip -n "$ns" link set lo up
        # the veth pair is made inside the switch, then its host end moves
        ip -n "$SWITCH" link add "port$i" type veth peer name eth0 netns "$ns"
        ip -n "$SWITCH" link set "port$i" master br0 up
        ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        shape "$ns" eth0 "$rate" "$delay" "$loss"     # host -> switch: delay and loss here once per path
        shape "$SWITCH" "port$i" "$rate" "" ""         # switch -> host
        echo "node$i slots=$slots" >> "$STATE/hostfile"
    done
    write_agent
    printf 'hosts=%s\nlink=%s\ndelay=%s\nloss=%s\nslots=%s\n' "$n" "$rate" "${delay:-0}" "${loss:-0}" "$slots" > "$STATE/settings"
    trap - EXIT INT TERM
    say "$n hosts up (node0..node$((n - 1)), $SUBNET.1-$SUBNET.$n), links $rate${delay:+, delay $delay}${loss:+, loss $loss%}; hostfile $STATE/hostfile"
}

# The rsh agent: Open MPI calls it as `agent HOST COMMAND...`, as it would
# call ssh, and the words of COMMAND are one shell line (ssh joins them).
write_agent() {
    cat > "$STATE/agent" <<EOF
#!/bin/sh
# rsh agent of the emulated cluster (scripts/cluster.sh): runs a command on a
# host = in its network namespace, under its host name.
host=\$1; shift
exec ip netns exec $PREFIX-"\$host" unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$1"' "\$host" "\$*"
EOF
    chmod +x "$STATE/agent"
}

# The environment a run on the cluster gets: where the hosts are, how to
# reach them, and which network is theirs (mpi-env.sh's settings come with
# the shell that runs the command).
run_env() {
    export OMPI_MCA_plm_rsh_agent=$STATE/agent
    export OMPI_MCA_orte_default_hostfile=$STATE/hostfile
    export OMPI_MCA_btl_tcp_if_include=$SUBNET.0/24 OMPI_MCA_oob_tcp_if_include=$SUBNET.0/24
}

cmd_run() {
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || die "run: give a command, e.g. cluster.sh run -- mpirun -np 4 ./zero2"
    [ ! -e "$STATE" ] || ours || not_ours
    [ -f "$STATE/agent" ] && ip netns list | grep -q "^$(node_ns 0)\b" || die "no cluster is up (cluster.sh up N makes one)"
    RUN_BEFORE=$(all_pids)
    # however the run ends (failed, timed out, interrupted), what it started on the hosts goes
    trap stop_run_leftovers EXIT
    run_env
    # on node0 as the agent starts a command there, in bash with mpi-env.sh's
    # settings and mpirun; in the background, so that a signal's trap runs
    # while the run is waited for
    ip netns exec "$(node_ns 0)" unshare --uts bash -c 'hostname node0 && source "$0" && "$@"' \
        "$HERE/scripts/mpi-env.sh" "$@" <&0 &
    RUN_PID=$!
    trap 'stop_run TERM' TERM
    trap 'stop_run HUP' HUP
    trap 'stop_run INT' INT
    local status
    while :; do
        wait "$RUN_PID" && status=0 || status=$?
        running "$RUN_PID" || return "$status"
    done
}

# A signal given to run: TERM and HUP go on to the run's mpirun, which stops
# every rank with them (rank 0 says where it got to), or to every process of
# a run without one; the INT of Ctrl-C reached mpirun already (the same
# process group), and a second one would make it kill the ranks outright.
# The run has STOP_WAIT_S to end; then what is left is killed on the way out.
stop_run() {
    local sig=$1 pids
    if [ "$sig" != INT ]; then
        pids=$(run_processes mpirun)
        [ -n "$pids" ] || pids="$RUN_PID $(run_processes)"
        kill -s "$sig" $pids 2>/dev/null || true
    fi
    local deadline=$((SECONDS + STOP_WAIT_S))
    while running "$RUN_PID" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    exit $((128 + $(kill -l "$sig")))
}

# Is the process alive (not ended, nor a zombie not yet waited for)?
running() {
    local stat
    stat=$(cat /proc/"$1"/stat 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

# The processes the run started (all named $1, when given), on every host.
run_processes() {
    ps -e -o pid=,ppid=,comm= | awk -v top="$RUN_PID" -v name="${1:-}" '
        { parent[$1] = $2; comm[$1] = $3 }
        END {
            for (p in parent) {
                for (q = parent[p]; q > 1 && q != top; q = parent[q]) ;
                if (q == top && (name == "" || comm[p] == name)) print p
            }
        }'
}

# Daemons or ranks of the run still alive on the hosts (those that were not
# there before it).
stop_run_leftovers() {
    local pid
    for pid in $(comm -13 <(echo "$RUN_BEFORE") <(all_pids)); do kill -KILL "$pid" 2>/dev/null || true; done
}

all_pids() {
    local ns
    for ns in $(our_namespaces); do ip netns pids "$ns" 2>/dev/null; done | sort
}

# What is up, host by host; exit 1 when a host of the cluster is gone.
cmd_status() {
    [ ! -e "$STATE" ] || ours || not_ours
    if [ -z "$(our_namespaces)" ]; then say "no cluster is up"; return 0; fi
    local ns i hosts gone=()
    hosts=$(sed -n 's/^hosts=//p' "$STATE/settings" 2>/dev/null)
    if [ -n "$hosts" ]; then
        say "$(tr '\n' ' ' < "$STATE/settings")"
        for ((i = 0; i < hosts; i++)); do our_namespaces | grep -qx "$(node_ns $i)" || gone+=("node$i"); done
    else
        gone+=("its settings ($STATE/settings)")
    fi
    our_namespaces | grep -qx "$SWITCH" || gone+=("the switch")
    for ns in $(our_namespaces); do
        case $ns in
            *-switch) echo "  $ns: bridge br0, $(ip -n "$ns" -o link show master br0 | wc -l) ports" ;;
            *) echo "  $ns: $(ip -n "$ns" -o -4 addr show dev eth0 | awk '{print $4}'), $(ip netns exec "$ns" tc qdisc show dev eth0 | sed 's/ refcnt [0-9]*//' | tr '\n' ';' | sed 's/;$//')" ;;
        esac
    done
    [ -f "$STATE/hostfile" ] && echo "  hostfile $STATE/hostfile, agent $STATE/agent"
    [ ${#gone[@]} -eq 0 ] || die "the cluster is damaged: ${gone[*]} gone (namespace deleted?); cluster.sh down, then up again" 1
}

case ${1:-} in
    up) shift; cmd_up "$@" ;;
    down) cmd_down; say "down" ;;
    run) shift; cmd_run "$@" ;;
    status) cmd_status ;;
    -h|--help|help) usage ;;
    "") usage >&2; exit 2 ;;
    *) die "unknown command $1 (up, run, status, down, --help)" ;;
esac
