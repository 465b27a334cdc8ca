#!/usr/bin/env bash
# A CPU fidelity campaign: ROUNDS rounds of one calibration recording and one recording of each of the four
# validation workloads, alternating, into OUT laid out as the shipped recordings are (OUT/cpu-calibrate-N,
# OUT/repeats/N/WORKLOAD, the last round's at OUT/WORKLOAD), so that benchmarks.fidelity_table --runs OUT reads
# it. Then it fits the campaign's profiles and prints the table for each:
#   T: a plain fit on this campaign's calibration recordings;
#   G: every calibration recording shipped plus these, a speed each (--speed-per-recording), its level
#      from this campaign's calibration recordings (the recordings of the hour);
#   S: the shipped profile, as it is.
#
#   bash benchmarks/fidelity_campaign.sh OUT [ROUNDS]      (about 19 minutes a round on 2 cores)
#
# Why alternate: the machine's speed drifts within the hour (docs/fidelity.md), so calibration and validation
# recordings made in turns see the same mixture of speeds. Run it on an otherwise idle machine: each real run
# records the other load it saw (summary.json machine_load), and sim.calibrate warns about busy runs.
set -euo pipefail
OUT=${1:?usage: fidelity_campaign.sh OUT [ROUNDS]}
ROUNDS=${2:-4}
PYTHON=${PYTHON:-python}
WORKLOADS=(cpu_chat cpu_overload cpu_long_prompts cpu_shared_prefix)
SHIPPED=sim/data/runs/cpu-small-float32
mkdir -p "$OUT"
echo "campaign started $(date -u +%FT%TZ), $ROUNDS rounds, into $OUT" | tee -a "$OUT/campaign.log"

record() {  # record WORKLOAD DIR: one real run, nothing else written
  $PYTHON -m sim.run "$1" --executor real --out "$2" --no-progress --quiet --no-dashboard
  echo "$(date -u +%TZ) $1 -> $2" | tee -a "$OUT/campaign.log"
}

for round in $(seq 1 "$ROUNDS"); do
  record cpu_calibrate "$OUT/cpu-calibrate-$round"
  for workload in "${WORKLOADS[@]}"; do
    folder=${workload//_/-}
    if [ "$round" -eq "$ROUNDS" ]; then
      record "$workload" "$OUT/$folder"
    else
      record "$workload" "$OUT/repeats/$round/$folder"
    fi
  done
done

mapfile -t CAMPAIGN_CALIBRATION < <(ls -d "$OUT"/cpu-calibrate-*)
mapfile -t SHIPPED_CALIBRATION < <(find "$SHIPPED" -maxdepth 3 -type d -name 'cpu-calibrate*' ! -path "$OUT/*" | sort)
$PYTHON -m sim.calibrate "${CAMPAIGN_CALIBRATION[@]}" -o "$OUT/profile-T.json"
$PYTHON -m sim.calibrate "${SHIPPED_CALIBRATION[@]}" "${CAMPAIGN_CALIBRATION[@]}" --speed-per-recording \
  --speed-level "${CAMPAIGN_CALIBRATION[@]}" -o "$OUT/profile-G.json"
for profile in shipped "$OUT/profile-T.json" "$OUT/profile-G.json"; do
  echo "== $profile"
  if [ "$profile" = shipped ]; then
    $PYTHON -m benchmarks.fidelity_table --runs "$OUT"
  else
    $PYTHON -m benchmarks.fidelity_table --runs "$OUT" --profile "$profile"
  fi
done | tee "$OUT/tables.txt"
echo "campaign ended $(date -u +%FT%TZ)" | tee -a "$OUT/campaign.log"
