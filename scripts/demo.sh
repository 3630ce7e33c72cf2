#!/usr/bin/env bash
# Runs a real Zipline pipeline on throwaway local databases, start to finish, in one command:
# a PostgreSQL 15 cluster (wal_level=logical) and a MariaDB server under a temporary directory
# on free ports. PostgreSQL gets a table with existing rows; MariaDB gets an empty database.
# Zipline creates the table in MariaDB (`create_tables: true`), copies the existing rows by its
# initial snapshot, then streams live inserts, updates and deletes; the demo shows Zipline's
# log as it goes, compares both sides, shows `zipline pipeline status` (slot, lag, checkpoints),
# stops Zipline with SIGTERM (it drains and confirms), runs `zipline pipeline drop` and removes
# everything it started.
#
# Needs root (it starts PostgreSQL as the `postgres` user with runuser, and MariaDB) and the
# postgresql-15 and mariadb-server packages. The first run builds Zipline (a debug build:
# several minutes on 2 cores, progress shown); later runs take seconds. KEEP=1 keeps the log.
set -euo pipefail
cd "$(dirname "$0")/.."

PGBIN=/usr/lib/postgresql/15/bin
[ "$(id -u)" = 0 ] || { echo "demo: run as root (it starts PostgreSQL as user postgres with runuser, and MariaDB)" >&2; exit 1; }
command -v mariadb-install-db >/dev/null && test -x "$PGBIN/initdb" || {
  echo "demo: needs PostgreSQL 15 and MariaDB server packages (apt-get install postgresql-15 mariadb-server)" >&2
  exit 1
}
echo "== building zipline (cargo build --bin zipline; the first build compiles ~300 crates and takes several minutes)"
cargo build --bin zipline
ZIPLINE=$(pwd)/target/debug/zipline
T0=$(date +%s%N)
elapsed() { local d=$(( ($(date +%s%N) - T0) / 100000000 )); printf '%3d.%ds' $((d / 10)) $((d % 10)); }

DIR=$(mktemp -d /tmp/zipline-demo-XXXXXX)
chmod 755 "$DIR"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PGPORT=$(free_port)
MYPORT=$(free_port)
ZPID=""
TAILPID=""
cleanup() {
  set +e
  [ -n "$ZPID" ] && kill "$ZPID" 2>/dev/null && wait "$ZPID" 2>/dev/null
  [ -n "$TAILPID" ] && kill "$TAILPID" 2>/dev/null
  [ -f "$DIR/my.pid" ] && kill "$(cat "$DIR/my.pid")" 2>/dev/null
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DIR/pg" -m immediate stop >/dev/null 2>&1
  sleep 0.5
  [ -n "${KEEP:-}" ] && cp "$DIR/zipline.log" /tmp/zipline-demo-last.log && echo "(log kept in /tmp/zipline-demo-last.log)"
  rm -rf "$DIR"
}
trap cleanup EXIT

echo "== $(elapsed) starting PostgreSQL (port $PGPORT) and MariaDB (port $MYPORT) under $DIR"
mkdir -p "$DIR/pg" "$DIR/my"
chown postgres "$DIR/pg"
touch "$DIR/pg.log" && chown postgres "$DIR/pg.log"
runuser -u postgres -- "$PGBIN/initdb" -D "$DIR/pg" -U postgres -A trust -E UTF8 --no-sync --no-instructions >/dev/null
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DIR/pg" -l "$DIR/pg.log" -w -o \
  "-p $PGPORT -k $DIR/pg -c listen_addresses=127.0.0.1 -c wal_level=logical -c max_replication_slots=10 -c max_wal_senders=10" start >/dev/null
mariadb-install-db --no-defaults --user=root --auth-root-authentication-method=normal --skip-test-db --datadir="$DIR/my" >/dev/null
mariadbd --no-defaults --user=root --datadir="$DIR/my" --socket="$DIR/my.sock" --port="$MYPORT" --bind-address=127.0.0.1 \
  --pid-file="$DIR/my.pid" --log-error="$DIR/my.err" --skip-log-bin --innodb-flush-log-at-trx-commit=2 2>/dev/null &
for _ in $(seq 100); do mariadb --protocol=TCP -h127.0.0.1 -P"$MYPORT" -uroot -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done

PSQL="$PGBIN/psql -X -q -h 127.0.0.1 -p $PGPORT -U postgres -d shop"
MYSQL="mariadb --protocol=TCP -h127.0.0.1 -P$MYPORT -uroot shop"
"$PGBIN/psql" -X -q -h 127.0.0.1 -p "$PGPORT" -U postgres -c 'CREATE DATABASE shop'
$PSQL -c "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2), status varchar(20), created_at timestamptz DEFAULT now())"
$PSQL -c "INSERT INTO orders (id, customer, amount, status) SELECT g, 'customer ' || g, g * 1.25, 'new' FROM generate_series(1, 5000) g"
mariadb --protocol=TCP -h127.0.0.1 -P"$MYPORT" -uroot -e 'CREATE DATABASE shop'
echo "   PostgreSQL: table orders with 5000 existing rows; MariaDB: database shop, no tables"

echo "== $(elapsed) starting: zipline pipeline apply -f examples/demo.yaml   (its log, abridged:)"
export POSTGRES_HOST=127.0.0.1 POSTGRES_PORT=$PGPORT POSTGRES_DATABASE=shop POSTGRES_USER=postgres \
  POSTGRES_PUBLICATION=zipline_demo POSTGRES_SLOT_NAME=zipline_demo MYSQL_PORT=$MYPORT ZIPLINE_LOG=info
: > "$DIR/zipline.log"
"$ZIPLINE" pipeline apply -f examples/demo.yaml --log-format text 2> "$DIR/zipline.log" &
ZPID=$!
# Show the log lines that tell the story, without colours or timestamps (tail ends with
# Zipline).
tail --pid="$ZPID" -n +1 -f "$DIR/zipline.log" 2>/dev/null | sed -u 's/\x1b\[[0-9;]*m//g' \
  | grep --line-buffered -E "created replication slot|created table|initial snapshot|table copied|snapshot (done|complete|finished)|streaming|progress|draining|drained|stopped|ERROR|WARN" \
  | sed -u -E 's/^[0-9T:.-]+Z +//; s/^/   zipline | /' &
TAILPID=$!

count() { $MYSQL -N -B -e "SELECT COUNT(*) FROM orders" 2>/dev/null || echo 0; }
for _ in $(seq 600); do [ "$(count)" = 5000 ] && break; kill -0 "$ZPID" 2>/dev/null || break; sleep 0.1; done
echo "== $(elapsed) initial snapshot: MariaDB's orders (created by Zipline) holds $(count) rows"
$MYSQL -e "SHOW CREATE TABLE orders\G" | sed -n 's/^/   /; 3,9p'

echo "== $(elapsed) live changes on PostgreSQL: 1000 inserts, 600 updates, 250 deletes, 1 key change, in 14 transactions"
for i in $(seq 0 9); do
  $PSQL -c "INSERT INTO orders (id, customer, amount, status) SELECT g, 'customer ' || g, g * 1.25, 'new' FROM generate_series($((5000+i*100+1)), $((5000+i*100+100))) g"
done
$PSQL -c "UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id % 10 IN (1, 2, 3) AND id > 4000"
$PSQL -c "DELETE FROM orders WHERE id % 20 = 0 AND id > 1000"
$PSQL -c "UPDATE orders SET status = 'shipped' WHERE id IN (1, 2, 3)"
$PSQL -c "UPDATE orders SET id = 99999, status = 'renumbered' WHERE id = 7"

sum_pg="SELECT count(*) || ' rows, checksum ' || md5(string_agg(id || ':' || status || ':' || amount, ',' ORDER BY id)) FROM orders"
sum_my="SELECT CONCAT(COUNT(*), ' rows, checksum ', MD5(GROUP_CONCAT(CONCAT(id, ':', status, ':', amount) ORDER BY id SEPARATOR ','))) FROM orders"
want=$($PSQL -At -c "$sum_pg")
got=""
for _ in $(seq 300); do
  got=$($MYSQL -N -B -e "SET SESSION group_concat_max_len = 1000000; $sum_my" 2>/dev/null || true)
  [ "$got" = "$want" ] && break
  sleep 0.1
done
echo "== $(elapsed) both sides now:"
echo "   PostgreSQL: $want"
echo "   MariaDB:    $got"
$MYSQL -t -e "SELECT id, customer, amount, status FROM orders WHERE id IN (1, 2, 7, 11, 99999) OR id = 5001 ORDER BY id" | sed 's/^/   /'

sleep 2.2   # one progress interval, so the status below includes the changes' confirmation
echo "== $(elapsed) the pipeline's status"
echo "   last progress line:"
grep progress "$DIR/zipline.log" | tail -1 | sed 's/\x1b\[[0-9;]*m//g; s/^/     /'
echo "   zipline pipeline status -f examples/demo.yaml   (works whether or not the pipeline runs):"
"$ZIPLINE" pipeline status -f examples/demo.yaml --log-format text 2>&1 | sed 's/^/     /'

echo "== $(elapsed) stopping zipline with SIGTERM (drain, checkpoint, confirm, exit 0)"
kill -TERM "$ZPID"
wait "$ZPID" && status=0 || status=$?
ZPID=""
sleep 0.3
kill "$TAILPID" 2>/dev/null || true
TAILPID=""
echo "   zipline exited with status $status"
echo "== $(elapsed) zipline pipeline drop -f examples/demo.yaml --yes   (removes the slot, the publication it made, its checkpoints)"
"$ZIPLINE" pipeline drop -f examples/demo.yaml --yes --log-format text 2>&1 | sed 's/^/   /'
if [ "$got" = "$want" ] && [ "$status" = 0 ]; then
  echo "== $(elapsed) demo OK: MariaDB matches PostgreSQL"
else
  echo "== demo FAILED; zipline log:" >&2
  cat "$DIR/zipline.log" >&2
  exit 1
fi
