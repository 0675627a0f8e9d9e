#!/bin/sh
# The container's entrypoint: `gateway serve` on the configuration directory
# $GATEWAY_CONFIG_DIR (default /etc/gateway), with the admin user's password taken from
# $GATEWAY_ADMIN_PASSWORD when that is set.
#
# How this works. The gateway reads no environment variables in its configuration files,
# and users.conf keeps a password as `gateway passwd` hashes it. So, with
# GATEWAY_ADMIN_PASSWORD set, this script copies the directory to
# $GATEWAY_RUNTIME_DIR/config (default /run/gateway/config; the original, often a
# read-only volume, is left alone), replaces any `admin:` line of the copy's users.conf
# with `admin:<hash>:"Administrator"`, unsets the variable and serves the copy. Relative
# paths in gateway.conf then resolve against the copy: give `store` as an absolute path.
# Without the variable the directory is served as it is (a mounted users.conf gives admin
# its password).
#
# With arguments it runs them instead of `gateway serve`, after the same preparation and
# with GATEWAY_CONFIG_DIR naming the directory prepared:
#
#     docker run --rm -i gateway:0.1.0 gateway passwd          # hash a password
#     docker run --rm -e GATEWAY_ADMIN_PASSWORD=... gateway:0.1.0 \
#         sh -c 'gateway check-config "$GATEWAY_CONFIG_DIR"'
set -eu

config=${GATEWAY_CONFIG_DIR:-/etc/gateway}

if [ -n "${GATEWAY_ADMIN_PASSWORD:-}" ]; then
    runtime=${GATEWAY_RUNTIME_DIR:-/run/gateway}/config
    rm -rf "$runtime"
    mkdir -p "$runtime"
    cp -R "$config/." "$runtime/"
    hash=$(printf '%s\n' "$GATEWAY_ADMIN_PASSWORD" | gateway passwd)
    {
        if [ -f "$config/users.conf" ]; then
            grep -v '^[[:space:]]*admin:' "$config/users.conf" || true
        fi
        printf 'admin:%s:"Administrator"\n' "$hash"
    } >"$runtime/users.conf"
    chmod 0600 "$runtime/users.conf"
    config=$runtime
fi
unset GATEWAY_ADMIN_PASSWORD
export GATEWAY_CONFIG_DIR="$config"

if [ "$#" -eq 0 ]; then
    exec gateway serve --config-dir "$config"
fi
exec "$@"
