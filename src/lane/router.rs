//! Routing by a stable hash of (table, key).
//!
//! The hash must not change between runs or releases: a restarted pipeline relies on the same
//! change landing on the same lane, whose checkpoint then skips it. So it is FNV-1a over a
//! tagged encoding of the key, not `std`'s unspecified `DefaultHasher`.

use super::queue::LaneSender;
use crate::change::{Change, Value, timestamp_to_unix_micros};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

struct Fnv(u64);

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }
    fn tagged(&mut self, tag: u8, bytes: &[u8]) {
        self.write(&[tag]);
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }
}

fn hash_value(h: &mut Fnv, v: &Value) {
    match v {
        Value::Null => h.tagged(0, &[]),
        Value::Bool(b) => h.tagged(1, &[u8::from(*b)]),
        // Integers of every width hash alike, so a column widened from int4 to int8 keeps
        // its rows on their lanes.
        Value::Int2(i) => h.tagged(2, &i64::from(*i).to_le_bytes()),
        Value::Int4(i) => h.tagged(2, &i64::from(*i).to_le_bytes()),
        Value::Int8(i) => h.tagged(2, &i.to_le_bytes()),
        Value::Float4(f) => h.tagged(3, &f64::from(*f).to_bits().to_le_bytes()),
        Value::Float8(f) => h.tagged(3, &f.to_bits().to_le_bytes()),
        Value::Numeric(s) => h.tagged(4, s.as_bytes()),
        Value::Text(s) => h.tagged(5, s.as_bytes()),
        Value::Bytes(b) => h.tagged(6, b),
        Value::Date(d) => h.tagged(7, &d.to_le_bytes()),
        Value::Time(t) => h.tagged(8, &t.to_le_bytes()),
        Value::Timestamp(t) => hash_timestamp(h, 9, *t),
        Value::TimestampTz(t) => hash_timestamp(h, 10, *t),
        Value::Uuid(u) => h.tagged(11, u),
        Value::Json(s) => h.tagged(12, s.as_bytes()),
        Value::Other { text, .. } => h.tagged(13, text.as_bytes()),
        Value::Unchanged => h.tagged(14, &[]),
    }
}

/// Timestamps count from 2000 now, but were hashed as microseconds since 1970 (which only
/// reached 294247 AD): that count keeps every row on the lane it had. Later instants, which
/// were refused before, hash their 128-bit count; the infinities their sentinels, as before.
fn hash_timestamp(h: &mut Fnv, tag: u8, t: i64) {
    match timestamp_to_unix_micros(t) {
        None => h.tagged(tag, &t.to_le_bytes()),
        Some(unix) => match i64::try_from(unix) {
            Ok(unix) => h.tagged(tag, &unix.to_le_bytes()),
            Err(_) => h.tagged(tag, &unix.to_le_bytes()),
        },
    }
}

/// The stable hash of this key of this table: the lane of `lanes` that owns it is the hash
/// modulo `lanes` (see [`lane_of`]). Stored with dead letters, so a lane finds its keys' dead
/// letters whatever the lane count was when they were written.
pub fn key_hash(schema: &str, table: &str, key: &[Value]) -> u64 {
    TableHash::new(schema, table).key_hash(key)
}

/// The lane (of `lanes`) that owns this key of this table.
pub fn lane_of(schema: &str, table: &str, key: &[Value], lanes: u32) -> u32 {
    TableHash::new(schema, table).lane_of(key, lanes)
}

/// [`key_hash`] with the table's part done: the state after hashing its schema and name, which
/// every key of the table shares. A router keeps it per table rather than hashing the two names
/// again for every change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableHash(u64);

impl TableHash {
    /// The hash state of table `schema.table`.
    pub fn new(schema: &str, table: &str) -> Self {
        let mut h = Fnv(FNV_OFFSET);
        h.tagged(b's', schema.as_bytes());
        h.tagged(b't', table.as_bytes());
        TableHash(h.0)
    }

    /// [`key_hash`] of `key` in this table.
    pub fn key_hash(self, key: &[Value]) -> u64 {
        let mut h = Fnv(self.0);
        for v in key {
            hash_value(&mut h, v);
        }
        // Fold the high bits in: FNV's low bits mix poorly for short inputs.
        h.0 ^ (h.0 >> 32)
    }

    /// [`lane_of`] `key` in this table.
    pub fn lane_of(self, key: &[Value], lanes: u32) -> u32 {
        (self.key_hash(key) % u64::from(lanes.max(1))) as u32
    }
}

/// The senders of one sink's lanes.
#[derive(Debug, Clone)]
pub struct Router {
    lanes: Vec<LaneSender>,
}

impl Router {
    /// A router over these lane queues (index = lane number).
    pub fn new(lanes: Vec<LaneSender>) -> Self {
        Router { lanes }
    }

    /// Number of lanes.
    pub fn lanes(&self) -> u32 {
        self.lanes.len() as u32
    }

    /// The queue of lane `lane`.
    pub fn sender(&self, lane: u32) -> &LaneSender {
        &self.lanes[lane as usize]
    }
}

/// An update that moved its row to a new key without sending some TOASTed columns (they were
/// not touched): the values exist only in the sink's row at the old key, so the sink must move
/// that row rather than delete it and insert a new one. Such a change travels whole to the new
/// key's lane, alone in its batch, and the source makes it a barrier when the old key's lane
/// differs (see [`needs_barrier`]).
pub fn is_toast_move(change: &Change) -> bool {
    change.old_key.is_some() && change.values.contains(&Value::Unchanged)
}

/// True when the change must be ordered against every lane: a truncate, or a TOAST move whose
/// old and new keys live on different lanes.
pub fn needs_barrier(change: &Change, lanes: u32) -> bool {
    if change.op == crate::change::Op::Truncate {
        return true;
    }
    match &change.old_key {
        Some(old) if is_toast_move(change) => {
            lane_of(&change.table.schema, &change.table.name, old, lanes)
                != lane_of(&change.table.schema, &change.table.name, &change.key, lanes)
        }
        _ => false,
    }
}

/// Where a change goes (see [`plan`]).
#[derive(Debug)]
pub struct Split {
    /// The lane of the change's key, which gets the change itself; applying it counts as a
    /// change applied.
    pub lane: u32,
    /// For a row moved to a key on another lane: that lane of the old key and the delete
    /// that must reach it first. Applying the delete does not count as a change applied.
    pub moved: Option<(u32, Change)>,
}

/// Where `change` goes, splitting off what must go elsewhere. `table` is the hash state of the
/// change's table ([`TableHash::new`] of its schema and name). The change stays in place, so
/// the caller moves it once, into its lane's parcel.
///
/// An update that moves a row to a new key whose lane differs from the old key's must reach
/// the old key's lane as a delete, or a later reuse of the old key could overtake it: the
/// change loses its `old_key` to that delete. Both halves keep the original position, which is
/// safe because they land on different lanes (each lane's checkpoint sees the position once).
/// The source change counts once, with the new row's half: the delete half does not count (it
/// is how the row leaves its old lane). When both keys share a lane the change travels whole
/// and the sink deletes the old key itself.
pub fn plan(change: &mut Change, table: TableHash, lanes: u32) -> Split {
    let lane = table.lane_of(&change.key, lanes);
    let moved = match &change.old_key {
        // A TOAST move travels whole: only the sink's stored row holds the untouched values.
        Some(old) if !is_toast_move(change) => {
            Some(table.lane_of(old, lanes)).filter(|&old_lane| old_lane != lane)
        }
        _ => None,
    };
    let moved = moved.map(|old_lane| {
        let delete = Change {
            position: change.position,
            op: crate::change::Op::Delete,
            table: change.table.clone(),
            key: change.old_key.take().map(|k| *k).unwrap_or_default(),
            old_key: None,
            values: Vec::new(),
        };
        (old_lane, delete)
    });
    Split { lane, moved }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_spreads() {
        // A fixed expectation: changing the hash silently would reroute keys across restarts.
        assert_eq!(
            lane_of("public", "orders", &[Value::Int8(4471)], 1024),
            lane_of("public", "orders", &[Value::Int4(4471)], 1024)
        );
        let first = lane_of("public", "orders", &[Value::Int8(1)], 1 << 30);
        assert_eq!(
            first,
            lane_of("public", "orders", &[Value::Int8(1)], 1 << 30)
        );
        let mut counts = [0u32; 8];
        for k in 0..8000 {
            counts[lane_of("public", "orders", &[Value::Int8(k)], 8) as usize] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "uneven lanes: {counts:?}");
        }
        assert_ne!(
            lane_of("public", "a", &[Value::Text("x".into())], 1 << 30),
            lane_of("public", "b", &[Value::Text("x".into())], 1 << 30)
        );
    }

    #[test]
    fn timestamp_keys_keep_the_lanes_they_had_when_counted_from_1970() {
        // What earlier releases computed: the tag, then the i64 microseconds since 1970.
        let before = |tag: u8, unix: i64| {
            let mut h = Fnv(FNV_OFFSET);
            h.tagged(b's', b"public");
            h.tagged(b't', b"events");
            h.tagged(tag, &unix.to_le_bytes());
            ((h.0 ^ (h.0 >> 32)) % (1 << 30)) as u32
        };
        let lane = |v: Value| lane_of("public", "events", &[v], 1 << 30);
        let unix = 1_706_704_496_123_456;
        let since_2000 = unix - crate::change::PG_EPOCH_MICROS;
        assert_eq!(lane(Value::Timestamp(since_2000)), before(9, unix));
        assert_eq!(lane(Value::TimestampTz(since_2000)), before(10, unix));
        assert_eq!(lane(Value::Timestamp(i64::MAX)), before(9, i64::MAX));
        assert_eq!(lane(Value::TimestampTz(i64::MIN)), before(10, i64::MIN));
        // Instants earlier releases could not carry still hash, and apart from infinity.
        let last = crate::change::TIMESTAMP_END - 1;
        assert_eq!(lane(Value::Timestamp(last)), lane(Value::Timestamp(last)));
        assert_ne!(
            lane(Value::Timestamp(last)),
            lane(Value::Timestamp(i64::MAX))
        );
    }

    #[test]
    fn table_hash_continues_key_hash_exactly() {
        let t = TableHash::new("public", "orders");
        for key in [
            vec![Value::Int8(4471)],
            vec![Value::Text("a".into()), Value::Int4(-2)],
            Vec::new(),
        ] {
            assert_eq!(t.key_hash(&key), key_hash("public", "orders", &key));
            assert_eq!(t.lane_of(&key, 7), lane_of("public", "orders", &key, 7));
        }
        assert_ne!(t, TableHash::new("public", "order"));
    }

    #[test]
    fn a_key_moved_to_another_lane_is_planned_as_a_delete_there_then_the_row() {
        let table = std::sync::Arc::new(crate::change::Table::new(
            "public".into(),
            "orders".into(),
            Vec::new(),
        ));
        let hash = TableHash::new("public", "orders");
        let lanes = 8;
        let key = |k: i64| -> crate::change::Key { smallvec::smallvec![Value::Int8(k)] };
        let moved = |old: i64, new: i64| Change {
            position: crate::change::Position::new(crate::change::Lsn(9), 1),
            op: crate::change::Op::Update,
            table: table.clone(),
            key: key(new),
            old_key: Some(Box::new(key(old))),
            values: vec![Value::Int8(new)],
        };
        // Two keys on different lanes, and one sharing the first's lane.
        let a = 1;
        let b = (2..).find(|&k| hash.lane_of(&key(k), lanes) != hash.lane_of(&key(a), lanes));
        let b = b.expect("some key on another lane");
        let c = (b + 1..).find(|&k| hash.lane_of(&key(k), lanes) == hash.lane_of(&key(a), lanes));
        let c = c.expect("some key on the same lane");

        let mut upsert = moved(a, b);
        let split = plan(&mut upsert, hash, lanes);
        let (lane, delete) = split.moved.expect("a delete for the old key's lane");
        assert_eq!(lane, hash.lane_of(&key(a), lanes));
        assert_eq!(
            (delete.op, &delete.key),
            (crate::change::Op::Delete, &key(a))
        );
        assert!(delete.values.is_empty() && delete.old_key.is_none());
        assert_eq!(split.lane, hash.lane_of(&key(b), lanes));
        assert_eq!((&upsert.key, &upsert.old_key), (&key(b), &None));
        assert_eq!(delete.position, upsert.position);

        // Both keys on one lane: the change travels whole, the sink deletes the old key.
        let mut whole = moved(a, c);
        let split = plan(&mut whole, hash, lanes);
        assert!(split.moved.is_none());
        assert_eq!(split.lane, hash.lane_of(&key(c), lanes));
        assert_eq!(whole.old_key, Some(Box::new(key(a))));
    }
}
