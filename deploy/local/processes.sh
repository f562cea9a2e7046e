# Sourced by up.sh and down.sh: the run directory's pids file lists each server as "PID START",
# START being the process's start time (field 22 of /proc/PID/stat, in clock ticks since boot).
# A PID alone could name an unrelated process by the time the file is read again (after a
# reboot, or once a server died and its PID was reused); the pair names one process only.

# Prints the start time of process $1, or nothing when there is no such process.
start_time() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }  # the fields after "(comm)", which may hold spaces; field 3 comes first
  local -a fields
  read -r -a fields <<< "$stat"
  echo "${fields[19]}"
}

# Whether process $1, started at $2, still runs.
still_running() {
  [[ -n $2 && $(start_time "$1") == "$2" ]]
}

# Appends process $1 to the pids file $2.
record_process() {
  echo "$1 $(start_time "$1")" >> "$2"
}
