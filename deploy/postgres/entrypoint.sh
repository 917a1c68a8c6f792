#!/bin/sh
# First start: initdb with POSTGRES_USER / POSTGRES_PASSWORD (scram-sha-256 over TCP) and
# create POSTGRES_DB; then exec the command (`postgres ARGS...`).
set -eu
: "${PGDATA:=/var/lib/postgresql/data}" "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?postgres-entrypoint: set POSTGRES_PASSWORD}"
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" -E UTF8 \
        --auth-local=scram-sha-256 --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    echo "unix_socket_directories = '/tmp'" >>"$PGDATA/postgresql.conf"
    # error details can hold a whole row (payload bytes): README "Database"
    echo "log_error_verbosity = terse" >>"$PGDATA/postgresql.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        pg_ctl -D "$PGDATA" -w -s -o "-c listen_addresses=''" start
        PGPASSWORD="$POSTGRES_PASSWORD" createdb -h /tmp -U "$POSTGRES_USER" "$POSTGRES_DB"
        pg_ctl -D "$PGDATA" -w -s -m fast stop
    fi
    echo "postgres-entrypoint: initialised $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi
exec "$@"
