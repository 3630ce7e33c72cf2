#!/usr/bin/env bash
# Runs a real Zipline pipeline on throwaway local databases: a PostgreSQL 15 cluster with
# wal_level=logical and a MariaDB server, both under a temporary directory on free ports.
# Creates a table on each side, starts `zipline pipeline apply -f examples/demo.yaml`, writes
# inserts, updates and deletes on PostgreSQL, shows them arriving in MariaDB, stops Zipline
# with SIGTERM (it drains and confirms), and removes everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."

PGBIN=/usr/lib/postgresql/15/bin
command -v mariadb-install-db >/dev/null && test -x "$PGBIN/initdb" || {
  echo "demo: needs PostgreSQL 15 and MariaDB server packages (apt-get install postgresql-15 mariadb-server)" >&2
  exit 1
}
cargo build --quiet --bin zipline
ZIPLINE=$(pwd)/target/debug/zipline

DIR=$(mktemp -d /tmp/zipline-demo-XXXXXX)
chmod 755 "$DIR"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PGPORT=$(free_port)
MYPORT=$(free_port)
ZPID=""
cleanup() {
  set +e
  [ -n "$ZPID" ] && kill "$ZPID" 2>/dev/null && wait "$ZPID" 2>/dev/null
  [ -f "$DIR/my.pid" ] && kill "$(cat "$DIR/my.pid")" 2>/dev/null
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DIR/pg" -m immediate stop >/dev/null 2>&1
  sleep 0.5
  [ -n "${KEEP:-}" ] && { cp "$DIR/zipline.log" /tmp/zipline-demo-last.log; } ; rm -rf "$DIR"
}
trap cleanup EXIT

echo "== starting PostgreSQL (port $PGPORT) and MariaDB (port $MYPORT) under $DIR"
mkdir -p "$DIR/pg" "$DIR/my"
chown postgres "$DIR/pg"
touch "$DIR/pg.log" && chown postgres "$DIR/pg.log"
runuser -u postgres -- "$PGBIN/initdb" -D "$DIR/pg" -U postgres -A trust -E UTF8 --no-sync --no-instructions >/dev/null
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DIR/pg" -l "$DIR/pg.log" -w -o \
  "-p $PGPORT -k $DIR/pg -c listen_addresses=127.0.0.1 -c wal_level=logical -c max_replication_slots=10 -c max_wal_senders=10" start >/dev/null
mariadb-install-db --no-defaults --user=root --auth-root-authentication-method=normal --skip-test-db --datadir="$DIR/my" >/dev/null
mariadbd --no-defaults --user=root --datadir="$DIR/my" --socket="$DIR/my.sock" --port="$MYPORT" --bind-address=127.0.0.1 \
  --pid-file="$DIR/my.pid" --log-error="$DIR/my.err" --skip-log-bin --innodb-flush-log-at-trx-commit=2 &
for _ in $(seq 100); do mariadb --protocol=TCP -h127.0.0.1 -P"$MYPORT" -uroot -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done

PSQL="$PGBIN/psql -X -q -h 127.0.0.1 -p $PGPORT -U postgres -d shop"
MYSQL="mariadb --protocol=TCP -h127.0.0.1 -P$MYPORT -uroot shop"
"$PGBIN/psql" -X -q -h 127.0.0.1 -p "$PGPORT" -U postgres -c 'CREATE DATABASE shop'
$PSQL -c "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2), status varchar(20), created_at timestamptz DEFAULT now())"
mariadb --protocol=TCP -h127.0.0.1 -P"$MYPORT" -uroot -e 'CREATE DATABASE shop'
$MYSQL -e "CREATE TABLE orders (id BIGINT PRIMARY KEY, customer TEXT NOT NULL, amount DECIMAL(12,2), status VARCHAR(20), created_at DATETIME(6))"

echo "== starting zipline pipeline apply -f examples/demo.yaml"
export POSTGRES_HOST=127.0.0.1 POSTGRES_PORT=$PGPORT POSTGRES_DATABASE=shop POSTGRES_USER=postgres \
  POSTGRES_PUBLICATION=zipline_demo POSTGRES_SLOT_NAME=zipline_demo MYSQL_PORT=$MYPORT
"$ZIPLINE" pipeline apply -f examples/demo.yaml 2> "$DIR/zipline.log" &
ZPID=$!
for _ in $(seq 100); do grep -q streaming "$DIR/zipline.log" && break; sleep 0.1; done

echo "== writing on PostgreSQL: 1000 inserts, 300 updates, 100 deletes, in 14 transactions"
for i in $(seq 0 9); do
  $PSQL -c "INSERT INTO orders (id, customer, amount, status) SELECT g, 'customer ' || g, g * 1.25, 'new' FROM generate_series($((i*100+1)), $((i*100+100))) g"
done
$PSQL -c "UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id % 10 IN (1, 2, 3)"
$PSQL -c "DELETE FROM orders WHERE id % 10 = 0"
$PSQL -c "UPDATE orders SET status = 'shipped' WHERE id IN (1, 2, 3)"
$PSQL -c "INSERT INTO orders (id, customer, amount, status) VALUES (4471, 'seed', 9.99, 'new')"

want=$($PSQL -At -c "SELECT count(*) || ' rows, checksum ' || md5(string_agg(id || ':' || status || ':' || amount, ',' ORDER BY id)) FROM orders")
for _ in $(seq 300); do
  got=$($MYSQL -N -B -e "SELECT CONCAT(COUNT(*), ' rows, checksum ', MD5(GROUP_CONCAT(CONCAT(id, ':', status, ':', amount) ORDER BY id SEPARATOR ','))) FROM orders" 2>/dev/null || true)
  [ "$got" = "$want" ] && break
  sleep 0.1
done
echo "   PostgreSQL: $want"
echo "   MariaDB:    $got"
echo "== a few rows in MariaDB:"
$MYSQL -t -e "SELECT id, customer, amount, status FROM orders WHERE id IN (1, 2, 10, 11, 4471) ORDER BY id"

echo "== stopping zipline with SIGTERM (drain, checkpoint, exit 0)"
kill -TERM "$ZPID"
wait "$ZPID" && status=0 || status=$?
ZPID=""
grep -E "progress|drained|stopped" "$DIR/zipline.log" | tail -4 || true
echo "   zipline exited with status $status"
$PSQL -At -c "SELECT 'slot ' || slot_name || ' confirmed_flush_lsn ' || confirmed_flush_lsn FROM pg_replication_slots"
if [ "$got" = "$want" ] && [ "$status" = 0 ]; then
  echo "== demo OK: MariaDB matches PostgreSQL"
else
  echo "== demo FAILED; zipline log:" >&2
  cat "$DIR/zipline.log" >&2
  exit 1
fi
