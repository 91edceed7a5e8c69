#!/usr/bin/env bash
# netns_hosts.sh - simulate several "machines" on one Linux box for castmesh
# host-agent tests, using network namespaces joined by a Linux bridge.
#
# Usage:
#   netns_hosts.sh check                 exit 0 if this machine can run the fixture,
#                                        else print a one-line reason and exit 1
#   netns_hosts.sh up PREFIX N           create bridge PREFIX-br and hosts PREFIX-h1..hN
#   netns_hosts.sh exec PREFIX K -- CMD  exec CMD inside host K (own netns + hostname)
#   netns_hosts.sh partition PREFIX K    cut host K off the bridge (packets vanish)
#   netns_hosts.sh heal PREFIX K         reconnect host K
#   netns_hosts.sh pids PREFIX K         pids of every process in host K's netns
#   netns_hosts.sh kill PREFIX K         SIGKILL every process in host K's netns
#   netns_hosts.sh down PREFIX           remove everything of PREFIX (idempotent)
#
# Layout (K = 1..N, N <= 244):
#   root netns:  bridge PREFIX-br, 198.18.0.1/24; veth PREFIX-vK enslaved to it
#   netns PREFIX-hK: eth0 (peer of PREFIX-vK) 198.18.0.(10+K)/24, lo up,
#                    no default route (only the /24 is reachable).
#
# Address rule: ONLY 198.18.0.0/24 (RFC 2544 benchmarking space, never routed
# on the internet) is ever configured. IPv6 is disabled inside the hosts and the
# root-side links get addrgenmode none, so not even link-local fe80:: addresses
# appear. Every fixture uses the same /24 on its own bridge: hosts of different
# PREFIXes are on separate L2 segments and cannot see each other, but if two
# fixtures are up at once the root namespace has two routes to 198.18.0.0/24,
# so talking to hosts *from the root namespace* is only reliable with a single
# fixture up. Talk host-to-host (run the controller in h1) when in doubt.
#
# PREFIX: 1-8 chars of [a-z0-9], so "PREFIX-vNNN" fits IFNAMSIZ (15 chars) and
# no PREFIX can be a prefix-match of another's names (no '-' allowed in it).
#
# br_netfilter: when the br_netfilter module is loaded with
# net.bridge.bridge-nf-call-iptables=1, frames forwarded between bridge ports
# traverse the iptables FORWARD chain, so a host with FORWARD policy DROP (e.g.
# Docker installs) silently blocks host-to-host traffic. The least invasive fix
# is used: if the `iptables` command exists and its FORWARD chain is not an
# empty ACCEPT chain, `up` inserts ONE rule scoped to this fixture's bridge
# (FORWARD -i PREFIX-br -o PREFIX-br -j ACCEPT) and `down` removes it; nothing
# else of the firewall is touched. Without `iptables` no
# rule can be added (a DROP set up by raw nft cannot be overridden from another
# table); set CASTMESH_NETNS_BRNF_OFF=1 to instead set the bridge-nf-call-*
# sysctls to 0 while any fixture is up (they are per network namespace, here
# the root one); the original values are saved and restored by the last `down`.
#
# State (saved sysctl values) lives in $CASTMESH_NETNS_STATE_DIR, default
# /run/castmesh-netns-hosts. Needs root, iproute2 (ip), util-linux (unshare).

set -euo pipefail

readonly SUBNET_PREFIX="198.18.0"
readonly BRIDGE_ADDR="${SUBNET_PREFIX}.1/24"
readonly MAX_HOSTS=244 # 10 + 244 = 254, the last usable address of the /24
readonly STATE_DIR="${CASTMESH_NETNS_STATE_DIR:-/run/castmesh-netns-hosts}"
readonly BRNF_KEYS=(bridge-nf-call-iptables bridge-nf-call-ip6tables bridge-nf-call-arptables)

prog=$(basename "$0")

die() {
    echo "$prog: $*" >&2
    exit 1
}

usage() {
    # The usage text is the block of the header between "Usage:" and the
    # first empty comment line.
    sed -n '/^# Usage:/,/^#$/{/^#$/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
}

validate_prefix() {
    local p=${1-}
    [[ -n "$p" ]] || die "missing PREFIX"
    [[ "$p" =~ ^[a-z0-9]{1,8}$ ]] ||
        die "invalid PREFIX '$p': use 1-8 characters of [a-z0-9] (interface names must fit 15 chars)"
}

validate_k() {
    local k=${1-}
    if ! [[ "$k" =~ ^[1-9][0-9]*$ ]] || ((k > MAX_HOSTS)); then
        die "invalid host number '$k': expected an integer in 1..$MAX_HOSTS"
    fi
}

ns_name() { echo "$1-h$2"; }
veth_name() { echo "$1-v$2"; }
bridge_name() { echo "$1-br"; }

require_ns() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$1" ||
        die "no network namespace '$1' (did you run '$prog up'?)"
}

# Host numbers of PREFIX currently present, from namespaces and root-side veths
# (not from N: a crashed run may have left a different number behind).
present_hosts() {
    local prefix=$1
    {
        ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^${prefix}-h\([0-9]\{1,\}\)\$/\1/p"
        ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
            sed -n "s/^${prefix}-v\([0-9]\{1,\}\)\$/\1/p"
    } | sort -un
}

# pids whose /proc/PID/ns/net is the same nsfs object (device:inode) as the
# namespace's bind mount under /run/netns. Comparing dev:ino rather than
# trusting `ip netns pids` keeps the output exact and independent of its format.
ns_pids() {
    local ns=$1 want p id
    want=$(stat -L -c '%d:%i' "/run/netns/$ns" 2>/dev/null) || return 0
    for p in /proc/[0-9]*; do
        # Processes may exit while we look: ignore every error here.
        id=$(stat -L -c '%d:%i' "$p/ns/net" 2>/dev/null) || continue
        [[ "$id" == "$want" ]] && echo "${p#/proc/}"
    done
    return 0
}

# SIGKILL every process of the namespace; repeat because a process can fork
# between listing and killing. Returns 1 if some survive after ~5 s.
kill_ns() {
    local ns=$1 i pids
    for ((i = 0; i < 50; i++)); do
        pids=$(ns_pids "$ns")
        [[ -z "$pids" ]] && return 0
        # shellcheck disable=SC2086 # word splitting of the pid list is wanted
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
    pids=$(ns_pids "$ns")
    [[ -z "$pids" ]] || { echo "$prog: processes survive SIGKILL in $ns: $pids" >&2; return 1; }
}

# ---- br_netfilter handling (see header) ----------------------------------

brnf_calls_iptables() {
    local f=/proc/sys/net/bridge/bridge-nf-call-iptables
    [[ -r "$f" && "$(cat "$f")" == 1 ]]
}

fw_rule() { # fw_rule -I|-C|-D BRIDGE
    iptables -w "$1" FORWARD -i "$2" -o "$2" -j ACCEPT
}

brnf_up() {
    local prefix=$1 br k
    br=$(bridge_name "$prefix")
    if command -v iptables >/dev/null 2>&1; then
        # Only needed when bridged frames reach iptables and FORWARD could drop
        # them (policy not ACCEPT, or any rule). Checking first avoids creating
        # a filter table on machines that have none (-S and -C create nothing).
        local fwd
        fwd=$(iptables -w -S FORWARD 2>/dev/null) || fwd="" # unusable iptables: skip
        if brnf_calls_iptables && [[ -n "$fwd" && "$fwd" != "-P FORWARD ACCEPT" ]] &&
            ! fw_rule -C "$br" 2>/dev/null; then
            fw_rule -I "$br" || die "cannot add iptables FORWARD accept rule for $br"
        fi
    elif [[ "${CASTMESH_NETNS_BRNF_OFF:-0}" == 1 ]] && [[ -d /proc/sys/net/bridge ]]; then
        mkdir -p "$STATE_DIR"
        # Save the originals only once: the first fixture to turn them off owns them.
        if [[ ! -e "$STATE_DIR/brnf.saved" ]]; then
            for k in "${BRNF_KEYS[@]}"; do
                [[ -r /proc/sys/net/bridge/$k ]] && echo "$k $(cat "/proc/sys/net/bridge/$k")"
            done >"$STATE_DIR/brnf.saved.tmp"
            mv "$STATE_DIR/brnf.saved.tmp" "$STATE_DIR/brnf.saved"
        fi
        touch "$STATE_DIR/brnf.user.$prefix"
        for k in "${BRNF_KEYS[@]}"; do
            [[ -w /proc/sys/net/bridge/$k ]] && echo 0 >"/proc/sys/net/bridge/$k"
        done
    fi
    return 0
}

brnf_down() {
    local prefix=$1 br k v
    br=$(bridge_name "$prefix")
    if command -v iptables >/dev/null 2>&1; then
        # Loop: an interrupted earlier `up` may have inserted it more than once.
        while fw_rule -D "$br" 2>/dev/null; do :; done
    fi
    if [[ -e "$STATE_DIR/brnf.user.$prefix" ]]; then
        rm -f "$STATE_DIR/brnf.user.$prefix"
        # Restore only when no other fixture still relies on the sysctls being 0.
        if ! compgen -G "$STATE_DIR/brnf.user.*" >/dev/null && [[ -e "$STATE_DIR/brnf.saved" ]]; then
            while read -r k v; do
                [[ -w /proc/sys/net/bridge/$k ]] && echo "$v" >"/proc/sys/net/bridge/$k"
            done <"$STATE_DIR/brnf.saved"
            rm -f "$STATE_DIR/brnf.saved"
        fi
    fi
    return 0
}

# ---- subcommands -----------------------------------------------------------

cmd_check() {
    [[ $(id -u) == 0 ]] || { echo "not root (network namespaces and bridges need root)"; exit 1; }
    command -v ip >/dev/null 2>&1 || { echo "'ip' (iproute2) not found"; exit 1; }
    command -v unshare >/dev/null 2>&1 || { echo "'unshare' (util-linux) not found"; exit 1; }
    local probe="cmchk$$" err
    if ! err=$(ip netns add "$probe" 2>&1); then
        echo "cannot create a network namespace: ${err//$'\n'/ }"
        exit 1
    fi
    ip netns del "$probe" 2>/dev/null || true
    if ! err=$(ip link add "$probe" type bridge 2>&1); then
        echo "cannot create a bridge: ${err//$'\n'/ }"
        exit 1
    fi
    ip link del "$probe" 2>/dev/null || true
    if ! err=$(unshare --uts true 2>&1); then
        echo "cannot create a UTS namespace: ${err//$'\n'/ }"
        exit 1
    fi
    exit 0
}

cmd_up() {
    [[ $# == 2 ]] || usage
    local prefix=$1 n=$2 br k ns veth
    validate_prefix "$prefix"
    if ! [[ "$n" =~ ^[1-9][0-9]*$ ]] || ((n > MAX_HOSTS)); then
        die "invalid host count '$n': expected an integer in 1..$MAX_HOSTS"
    fi
    br=$(bridge_name "$prefix")

    # Leftovers of a crashed run with the same PREFIX would make `ip ... add` fail.
    cmd_down "$prefix"

    if ip -o -4 addr show 2>/dev/null | grep -q " inet ${SUBNET_PREFIX//./\\.}\.1/"; then
        echo "$prog: warning: 198.18.0.1 is already on another interface (another fixture up?);" \
            "root-namespace access to the hosts is ambiguous, host-to-host traffic is unaffected" >&2
    fi

    # On any failure below (set -e or die), undo the partial setup so nothing
    # is left behind. A global, because the EXIT trap may run outside cmd_up.
    UP_PREFIX=$prefix
    trap 'rc=$?; if ((rc != 0)); then cmd_down "$UP_PREFIX" || true; fi; exit $rc' EXIT

    # STP off: ports forward immediately instead of after a listening delay.
    ip link add "$br" type bridge stp_state 0 forward_delay 0
    ip link set dev "$br" addrgenmode none # no IPv6 link-local address
    ip addr add "$BRIDGE_ADDR" dev "$br"
    ip link set dev "$br" up
    brnf_up "$prefix"

    for ((k = 1; k <= n; k++)); do
        ns=$(ns_name "$prefix" "$k")
        veth=$(veth_name "$prefix" "$k")
        ip netns add "$ns"
        # Disable IPv6 in the namespace before eth0 exists so it never gets
        # an address outside 198.18.0.0/24 (not even fe80:: or ::1).
        # shellcheck disable=SC2016 # expanded by the inner sh, not here
        ip netns exec "$ns" sh -c '
            for c in all default lo; do
                f=/proc/sys/net/ipv6/conf/$c/disable_ipv6
                [ -w "$f" ] && echo 1 > "$f"
            done
            exit 0'
        # Create the peer directly inside the namespace, already named eth0.
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set dev "$veth" addrgenmode none
        ip link set dev "$veth" master "$br"
        ip link set dev "$veth" up
        ip -n "$ns" link set dev lo up
        ip -n "$ns" addr add "${SUBNET_PREFIX}.$((10 + k))/24" dev eth0
        ip -n "$ns" link set dev eth0 up
    done
    trap - EXIT
}

cmd_exec() {
    [[ $# -ge 4 && "$3" == "--" ]] || die "usage: $prog exec PREFIX K -- CMD [ARGS...]"
    local prefix=$1 k=$2 ns
    validate_prefix "$prefix"
    validate_k "$k"
    shift 3
    ns=$(ns_name "$prefix" "$k")
    require_ns "$ns"
    export CASTMESH_TEST_HOST="$ns"
    # Every step execs into the next, so the pid of this script becomes the pid
    # of CMD: `ip netns exec` and `unshare` (without --fork) exec, and sh
    # ends in `exec`. Writing /proc/sys/kernel/hostname in the new UTS
    # namespace avoids depending on a `hostname` binary.
    # shellcheck disable=SC2016 # expanded by the inner sh, not here
    exec ip netns exec "$ns" unshare --uts -- \
        sh -c 'echo "$CASTMESH_TEST_HOST" > /proc/sys/kernel/hostname && exec "$@"' sh "$@"
}

cmd_partition() {
    [[ $# == 2 ]] || usage
    validate_prefix "$1"
    validate_k "$2"
    local veth
    veth=$(veth_name "$1" "$2")
    ip link show dev "$veth" >/dev/null 2>&1 || die "no interface '$veth' (host $2 of '$1' not up?)"
    # Administratively down: the bridge port is disabled and frames to or from
    # the host are dropped silently, as with a pulled cable (no RST, no ICMP).
    ip link set dev "$veth" down
}

cmd_heal() {
    [[ $# == 2 ]] || usage
    validate_prefix "$1"
    validate_k "$2"
    local veth br master
    veth=$(veth_name "$1" "$2")
    br=$(bridge_name "$1")
    ip link show dev "$veth" >/dev/null 2>&1 || die "no interface '$veth' (host $2 of '$1' not up?)"
    ip link show dev "$br" >/dev/null 2>&1 || die "no bridge '$br' (fixture '$1' not up?)"
    master=$(ip -o link show dev "$veth" | sed -n 's/.* master \([^ ]*\) .*/\1/p')
    [[ "$master" == "$br" ]] || ip link set dev "$veth" master "$br"
    ip link set dev "$veth" up
    # With STP off the port goes straight back to forwarding once up; make
    # sure it was not left disabled/blocking (the bridge reports "state").
    bridge link set dev "$veth" state 3 2>/dev/null || true
}

# The namespace of host K of PREFIX (both checked), which must exist.
existing_host_ns() {
    validate_prefix "$1"
    validate_k "$2"
    local ns
    ns=$(ns_name "$1" "$2")
    require_ns "$ns"
    echo "$ns"
}

cmd_pids() {
    [[ $# == 2 ]] || usage
    local ns
    ns=$(existing_host_ns "$1" "$2")
    ns_pids "$ns"
}

cmd_kill() {
    [[ $# == 2 ]] || usage
    local ns
    ns=$(existing_host_ns "$1" "$2")
    kill_ns "$ns"
}

cmd_down() {
    [[ $# == 1 ]] || usage
    local prefix=$1 br k ns veth rc=0
    validate_prefix "$prefix"
    br=$(bridge_name "$prefix")
    for k in $(present_hosts "$prefix"); do
        ns=$(ns_name "$prefix" "$k")
        veth=$(veth_name "$prefix" "$k")
        if [[ -e "/run/netns/$ns" ]]; then
            kill_ns "$ns" || rc=1
        fi
        # Deleting the root-side veth also removes eth0 inside; do it
        # explicitly in case something still pins the namespace.
        ip link del dev "$veth" 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    brnf_down "$prefix"
    ip link del dev "$br" 2>/dev/null || true
    # Idempotent and "never fails if things are already gone": report, but
    # only fail if something of ours is still there.
    if [[ -n "$(present_hosts "$prefix")" ]] || ip link show dev "$br" >/dev/null 2>&1; then
        echo "$prog: down $prefix: some objects could not be removed" >&2
        rc=1
    fi
    return $rc
}

main() {
    [[ $# -ge 1 ]] || usage
    local cmd=$1
    shift
    case "$cmd" in
    check) cmd_check ;;
    up) cmd_up "$@" ;;
    exec) cmd_exec "$@" ;;
    partition) cmd_partition "$@" ;;
    heal) cmd_heal "$@" ;;
    pids) cmd_pids "$@" ;;
    kill) cmd_kill "$@" ;;
    down) cmd_down "$@" ;;
    -h | --help | help) usage ;;
    *) echo "$prog: unknown subcommand '$cmd'" >&2; usage ;;
    esac
}

main "$@"
