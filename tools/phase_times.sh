# Sourced by tools/test.sh and tools/sanitize.sh: the wall and CPU time of each build and test
# phase, appended to $ENGRAM_PHASE_TIMES when it names a file (.ci/run prints them at the end).
# CPU time is user+sys of the finished child processes, so it counts the work whatever else
# shares the machine; wall time is what a run waits.

phase_times_tmp=$(mktemp)
trap 'rm -f "$phase_times_tmp"*' EXIT

# Sets phase_cpu_now to the user+sys seconds of this shell's finished children: the second line
# of the `times` builtin, which must run in this shell (in a subshell, as within $(...), its
# counters start from zero), hence the file. A phase run in the background, in its own subshell
# (tools/test.sh), counts its own children; the file's name keeps two such shells apart.
phase_cpu() {
  local file=$phase_times_tmp.$BASHPID
  times >"$file"
  phase_cpu_now=$(awk 'function sec(t, m) { split(t, m, "m"); sub("s", "", m[2]);
                                            return m[1] * 60 + m[2] }
                       NR == 2 { printf "%.2f\n", sec($1) + sec($2) }' "$file")
  rm -f "$file"
}

# Starts the clock of the next phase.
phase_start() {
  phase_wall0=$(date +%s.%N)
  phase_cpu
  phase_cpu0=$phase_cpu_now
}

# Records the phase that started at the last phase_start or phase_end, and starts the next.
phase_end() {
  local wall cpu
  wall=$(date +%s.%N)
  phase_cpu
  cpu=$phase_cpu_now
  if [[ -n ${ENGRAM_PHASE_TIMES:-} ]]; then
    awk -v p="$1" -v w="$wall - $phase_wall0" -v c="$cpu - $phase_cpu0" \
      'BEGIN { split(w, a, " - "); split(c, b, " - ");
               printf "%s\t%.0f\t%.0f\n", p, a[1] - a[2], b[1] - b[2] }' >>"$ENGRAM_PHASE_TIMES"
  fi
  phase_wall0=$wall
  phase_cpu0=$cpu
}
