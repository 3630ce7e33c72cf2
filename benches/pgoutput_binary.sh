#!/bin/bash
# pgoutput's `binary` option on the walsender's side: the same backlog (transactions of 100
# changes: 60 inserts, 30 updates, 10 deletes on the backlog benchmarks' `items` table) read
# through pg_logical_slot_peek_binary_changes with `binary` off and on, alternating, on a
# throwaway PostgreSQL 15 under /dev/shm. Prints each read's time. Run as root (the server runs
# as `postgres`) or as the user owning the PostgreSQL binaries:
#
#   N=1000000 benches/pgoutput_binary.sh
set -euo pipefail
B=/usr/lib/postgresql/15/bin
D=/dev/shm/zipline-pgoutput-binary
PORT=${PORT:-54999}
N=${N:-1000000}
rm -rf "$D"
mkdir -p "$D"
run() {
  if [[ $(id -u) == 0 ]]; then su postgres -c "$*"; else bash -c "$*"; fi
}
[[ $(id -u) == 0 ]] && chown postgres "$D"
trap 'run "$B/pg_ctl -D $D/data stop -m immediate" >/dev/null 2>&1 || true; rm -rf "$D"' EXIT
run "$B/initdb -D $D/data -A trust -U postgres" >/dev/null
run "$B/pg_ctl -D $D/data -o '-p $PORT -k $D -c wal_level=logical -c fsync=off -c max_wal_size=4GB' -l $D/log start" >/dev/null
P=("$B/psql" -h "$D" -p "$PORT" -U postgres -qAt)
"${P[@]}" -c "CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, qty int NOT NULL, price numeric(12,2) NOT NULL, updated_at timestamptz NOT NULL)"
"${P[@]}" -c "CREATE PUBLICATION p FOR TABLE items" -c "SELECT pg_create_logical_replication_slot('s', 'pgoutput')" >/dev/null
"${P[@]}" <<SQL
DO \$\$
DECLARE t int;
BEGIN
  FOR t IN 0..($N / 100 - 1) LOOP
    INSERT INTO items SELECT g, 'item-' || g || '-' || (g % 1000), g % 10000, (g % 100000) + 0.25,
        '2024-01-01'::timestamptz + g * interval '1 second'
      FROM generate_series(t * 60 + 1, t * 60 + 60) g;
    UPDATE items SET qty = qty + 1, name = name || 'x', updated_at = updated_at + interval '1 hour'
      WHERE id BETWEEN greatest(1, t * 60 - 29) AND greatest(30, t * 60);
    DELETE FROM items WHERE t > 1 AND id BETWEEN t * 60 - 39 AND t * 60 - 30;
    COMMIT;
  END LOOP;
END \$\$;
SQL
for round in 1 2 3; do
  for binary in false true; do
    start=$(date +%s.%N)
    n=$("${P[@]}" -c "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, 'proto_version', '1', 'publication_names', 'p', 'binary', '$binary')")
    end=$(date +%s.%N)
    printf 'round %d binary=%-5s %d messages in %.2f s\n' "$round" "$binary" "$n" "$(echo "$end - $start" | bc)"
  done
done
