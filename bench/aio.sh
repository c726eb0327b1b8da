#!/usr/bin/env bash
# aio.sh [DIR]: the aio module against fio on one preallocated file in DIR
# (default build/bench/aio-files; give a directory on the NVMe disk that
# stage 06's --nvme-path would use). For every block size and queue depth it
# measures read and write GB/s of the module (bench/aio_sweep.c) and of
# `fio --ioengine=libaio --direct=1` at the same point and file, interleaved
# per point (the order flips every round), and writes one JSON object to
# build/bench/aio.json: ratios per point and best against best, the targets
# (every point >= 0.9 of fio, best >= 0.9 of fio's best) and the defaults it
# recommends. Raw runs are kept in build/bench/aio_runs.jsonl.
#
# Knobs (environment): AIO_BLOCKS_KB (default "128 256 512 1024 2048 4096
# 8192"), AIO_DEPTHS ("1 2 4 8 16 32 64"), AIO_ROUNDS (3), AIO_FILE_MIB
# (1024). The full sweep moves 2 x 2 x 49 x 3 = 588 GiB: about 5 minutes at
# 2 GB/s, longer on a slower disk.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
dir=${1:-build/bench/aio-files}
blocks_kb=${AIO_BLOCKS_KB:-"128 256 512 1024 2048 4096 8192"}
depths=${AIO_DEPTHS:-"1 2 4 8 16 32 64"}
rounds=${AIO_ROUNDS:-3}
file_mib=${AIO_FILE_MIB:-1024}
out=build/bench
mkdir -p "$out" "$dir"

if ! command -v fio > /dev/null; then
    echo "bench aio: installing fio (Debian package)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq fio > /dev/null
fi

build=build
[ "${GPU:-1}" = 0 ] && build=build-nogpu
make -s GPU="${GPU:-1}" "$build/bench/aio_sweep" >&2
sweep="$build/bench/aio_sweep"
file="$dir/aio-bench.bin"
echo "bench aio: preparing ${file_mib} MiB in $file" >&2
"$sweep" prepare "$file" "$file_mib"
bytes=$((file_mib * 1024 * 1024))
runs="$out/aio_runs.jsonl"
: > "$runs"

ours() {  # op block_kb depth round
    "$sweep" run "$file" "$1" "$2" "$3" | sed "s/}\$/, \"round\": $4}/" >> "$runs"
}
fio_point() {  # op block_kb depth round
    local json="$out/aio_fio_last.json"
    fio --name=aio-sweep --filename="$file" --rw="$1" --bs="${2}k" --iodepth="$3" \
        --ioengine=libaio --direct=1 --size="$bytes" --fallocate=none --invalidate=0 \
        --output-format=json --output="$json" > /dev/null
    python3 - "$json" "$1" "$2" "$3" "$4" "$bytes" >> "$runs" <<'EOF'
import json, sys
path, op, block_kb, depth, rnd, size = sys.argv[1:]
job = json.load(open(path))["jobs"][0][op]
print(json.dumps({"tool": "fio", "op": op, "block_kb": int(block_kb), "depth": int(depth),
                  "bytes": job["io_bytes"], "seconds": job["runtime"] / 1000.0,
                  "gbps": job["bw_bytes"] / 1e9, "round": int(rnd), "size": int(size)}))
EOF
}

points=$(( $(wc -w <<< "$blocks_kb") * $(wc -w <<< "$depths") ))
echo "bench aio: $points points x read, write x ours, fio x $rounds rounds" >&2
for b in $blocks_kb; do
    for d in $depths; do
        for r in $(seq "$rounds"); do
            for op in read write; do
                if [ $((r % 2)) -eq 1 ]; then ours $op "$b" "$d" "$r"; fio_point $op "$b" "$d" "$r"
                else fio_point $op "$b" "$d" "$r"; ours $op "$b" "$d" "$r"; fi
            done
        done
    done
done
rm -f "$out/aio_fio_last.json" "$file"

python3 bench/summarize_aio.py "$runs" "$file" "$(fio --version)" > "$out/aio.json"
cat "$out/aio.json"
