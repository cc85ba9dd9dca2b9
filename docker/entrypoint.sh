#!/bin/sh
# Entry point of the hvdlite images. A job's key pair mounted at /etc/hvdlite/ssh (id_ed25519 and
# id_ed25519.pub, the same in every container) lets the containers reach each other over ssh on
# $HVDLITE_SSHD_PORT (2222). The command `sshd` makes this container a host that hvdlite-run or mpirun in
# another one starts ranks on; any other command runs as given.
set -eu

port="${HVDLITE_SSHD_PORT:-2222}"
keys=/etc/hvdlite/ssh
if [ -f "$keys/id_ed25519" ]; then
    mkdir -p "$HOME/.ssh"
    chmod 700 "$HOME/.ssh"
    cp "$keys/id_ed25519" "$HOME/.ssh/id_ed25519"
    chmod 600 "$HOME/.ssh/id_ed25519"
    cp "$keys/id_ed25519.pub" "$HOME/.ssh/authorized_keys"
    chmod 600 "$HOME/.ssh/authorized_keys"
    # The containers are the job's own machines, known only by the key they share: accept their host keys
    # on first contact.
    printf 'Host *\n    Port %s\n    StrictHostKeyChecking accept-new\n    IdentityFile ~/.ssh/id_ed25519\n' \
        "$port" > "$HOME/.ssh/config"
    chmod 600 "$HOME/.ssh/config"
fi

if [ "${1:-}" = "sshd" ]; then
    if [ ! -f "$keys/id_ed25519.pub" ]; then
        echo "hvdlite-entrypoint: sshd needs the job's key pair mounted at $keys (id_ed25519, id_ed25519.pub)" >&2
        exit 2
    fi
    state="$HOME/.sshd"
    mkdir -p "$state"
    [ -f "$state/host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$state/host_ed25519_key"
    # Not root: sshd serves this one user, on an unprivileged port, with its own host key.
    exec /usr/sbin/sshd -D -e -p "$port" -h "$state/host_ed25519_key" -o PidFile="$state/sshd.pid" \
        -o UsePAM=no -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no \
        -o AuthorizedKeysFile=.ssh/authorized_keys
fi
exec "$@"
