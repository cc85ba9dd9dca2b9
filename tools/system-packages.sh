#!/usr/bin/env bash
# The Debian packages the test suite needs, installed when this can be done without asking anyone.
#
#   tools/system-packages.sh          check; as root with apt-get, install what is missing
#   tools/system-packages.sh --list   print the package names (for docs and the Dockerfile)
#
# Why each one:  Open MPI    - the mpirun bootstrap tests and the benchmark's MPI peer
#                OpenSSH     - the multi-host tests run an sshd in each network-namespace host
#                iproute2    - `ip netns` / veth pairs that make those hosts
#                tmux        - the terminal the launcher's progress-bar tests read back
#                Java 17     - the JVMs of the Spark tests (pyspark 4 needs Java 17 or later)
#                iptables    - the chaos test drops a share of a host's packets (iptables-legacy's statistic match,
#                              since kernels without tc's netem are common on VMs)
# And one that only saves time, installed where this script may install and never required:
#                ccache      - the packaging test builds the wheel from the sdist: the core's objects come from
#                              the editable install's compile instead of a second one (setup.py uses it if found)
# Without root it changes nothing: it names the one command to run and fails at once, so `make test`
# never starts a suite that would end in a pile of errors.
set -euo pipefail

PACKAGES=(openmpi-bin libopenmpi-dev openssh-server openssh-client iproute2 tmux openjdk-17-jre-headless iptables)
# One program per package: present means installed.
PROGRAMS=(mpirun mpicc sshd ssh ip tmux java iptables-legacy)
PATH="$PATH:/usr/sbin:/sbin"  # sshd and ip live there; a non-root PATH often lacks them

if [ "${1:-}" = "--list" ]; then
  echo "${PACKAGES[*]}"
  exit 0
fi

missing=()
for i in "${!PACKAGES[@]}"; do
  command -v "${PROGRAMS[$i]}" >/dev/null 2>&1 || missing+=("${PACKAGES[$i]}")
done
can_install=0
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && can_install=1
optional=()
command -v ccache >/dev/null 2>&1 || optional+=(ccache)
if [ ${#missing[@]} -eq 0 ]; then
  if [ ${#optional[@]} -gt 0 ] && [ $can_install = 1 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${optional[@]}" >/dev/null) || true
  fi
  exit 0
fi

install="apt-get update && apt-get install -y ${missing[*]}"
if [ $can_install = 1 ]; then
  echo "Installing the system packages the tests need: ${missing[*]}"
  apt-get update -qq
  # Slim images drop /usr/share/man, and the JRE's post-install step fails without the folder of its man page.
  mkdir -p /usr/share/man/man1 2>/dev/null || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" "${optional[@]}" >/dev/null
  exit 0
fi

{
  echo "The tests need system packages that are not installed: ${missing[*]}"
  if command -v apt-get >/dev/null 2>&1; then
    echo "Install them once, then run make test again:"
    echo "    sudo sh -c '$install'"
  else
    echo "This system has no apt-get: install the equivalents of those Debian packages (Open MPI with its"
    echo "headers, an OpenSSH server and client, iproute2, tmux, a Java 17 runtime, iptables), then run make test"
    echo "again."
  fi
} >&2
exit 1
