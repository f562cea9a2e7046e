# Sourced by up.sh and down.sh: the run directory's pids file lists each server as "PID START",
# START being the process's start time (field 22 of /proc/PID/stat, in clock ticks since boot).
# A PID alone could name an unrelated process by the time the file is read again (after a
# reboot, or once a server died and its PID was reused); the pair names one process only. Linux
# only (/proc).

# Prints the start time of process $1, or nothing when there is no such process.
start_time() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }  # the fields after "(comm)", which may hold spaces; field 3 comes first
  local -a fields
  read -r -a fields <<< "$stat"
  echo "${fields[19]}"
}

# Whether process $1, started at $2, still runs. A line of an older up.sh has no start time:
# then the process must at least be a knnserve server.
still_running() {
  if [[ -z ${2:-} ]]; then
    [[ $(cat "/proc/$1/comm" 2>/dev/null) =~ ^knnserve-(shard|router)$ ]]
    return
  fi
  [[ $(start_time "$1") == "$2" ]]
}

# Prints the servers of pids file $1 that still run, one PID per line (a last line without its
# newline included).
running_processes() {
  local pid start
  while read -r pid start || [[ -n ${pid:-} ]]; do
    if [[ -n $pid ]] && still_running "$pid" "${start:-}"; then echo "$pid"; fi
  done < "$1"
}

# Appends process $1 to the pids file $2.
record_process() {
  echo "$1 $(start_time "$1")" >> "$2"
}
