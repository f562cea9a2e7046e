#!/usr/bin/env bash
# Prints, one per line, the Debian packages that provide the shared libraries the given
# executables load (ldd), so that a runtime image installs exactly those. Libraries that sit
# next to an executable (knnserve's own, e.g. libknnserve_spm.so) are copied with it and not
# listed. With --bundle DIR, libraries that no package owns but that were installed under
# /usr/local (the CUDA toolkit's runtime, in CUDA builds) are copied into DIR for the image to
# carry. Fails, naming it, on a library that is missing or that nothing accounts for.
#
#   deploy/docker/runtime-packages.sh [--bundle DIR] EXECUTABLE...
set -euo pipefail
bundle=""
if [[ ${1:-} == --bundle ]]; then
  bundle=$2
  shift 2
  mkdir -p "$bundle"
fi
(($# > 0)) || { echo "usage: $0 [--bundle DIR] EXECUTABLE..." >&2; exit 2; }
declare -A packages=()
for exe in "$@"; do
  [[ -x $exe && -f $exe ]] || { echo "runtime-packages: $exe is not an executable" >&2; exit 1; }
  own_dir=$(cd "$(dirname "$exe")" && pwd -P)
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    if [[ $path == "not" ]]; then
      echo "runtime-packages: $exe needs $name, which is not found" >&2
      exit 1
    fi
    real=$(readlink -f "$path")
    [[ $(dirname "$real") == "$own_dir" ]] && continue
    # dpkg knows a library by the path its package installed: the link ldd followed (a
    # /usr/lib alternative such as libblas.so.3) or the file it resolves to.
    if owner=$(dpkg-query -S "$path" 2>/dev/null || dpkg-query -S "$real" 2>/dev/null); then
      packages[${owner%%:*}]=1
    elif [[ -n $bundle && $real == /usr/local/* ]]; then
      cp -L "$path" "$bundle/$name"
    else
      echo "runtime-packages: no installed package owns $path ($real), needed by $exe" >&2
      exit 1
    fi
  done < <(ldd "$exe")
done
printf '%s\n' "${!packages[@]}" | sort
