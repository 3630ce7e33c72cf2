//! The type zoo for `tests/pipelines/types.rs`: a source table with a column of every common
//! PostgreSQL type, rows of edge values, and a canonical text per value on each side so the
//! sink can be compared with the source value for value.

/// Source types: an enum (also as an array) lives in `zoo_enum`, because the PostgreSQL sink
/// cannot create tables with types the source defined (the test creates that one itself).
pub const SOURCE_DDL: &str = r#"
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy 😀', 'it''s');
CREATE TABLE zoo (
    id int PRIMARY KEY,
    i2 smallint, i4 integer, i8 bigint,
    n numeric, n124 numeric(12,4),
    f4 real, f8 double precision,
    b boolean, t text, vc varchar(20), c char(5),
    by bytea, u uuid, j json, jb jsonb,
    d date, tm time, ttz timetz, ts timestamp, tstz timestamptz,
    iv interval, ai int[], at text[], ip inet, cn cidr
);
CREATE TABLE zoo_enum (id int PRIMARY KEY, m mood, ma mood[]);
"#;

/// `zoo`'s columns after `id`, in order.
pub const COLUMNS: &[&str] = &[
    "i2", "i4", "i8", "n", "n124", "f4", "f8", "b", "t", "vc", "c", "by", "u", "j", "jb", "d",
    "tm", "ttz", "ts", "tstz", "iv", "ai", "at", "ip", "cn",
];

/// Rows of edge values (ids 1..=10), as `INSERT` statements; the session's time zone varies
/// so that timestamptz literals without an offset are read in several zones. Rows 8 to 10 hold
/// the ends of PostgreSQL's date and timestamp ranges (5874897 AD and 294276 AD; 4714-11-24 BC,
/// and the year after).
pub const ROWS: &str = r#"
INSERT INTO zoo (id) VALUES (1);
INSERT INTO zoo VALUES (2, -32768, -2147483648, -9223372036854775808,
    '-123456789012345678901234567890.123456789', -99999999.9999,
    '-3.4028235e38', '-1.7976931348623157e308', false, '', '', '', '\x', 
    '00000000-0000-0000-0000-000000000000', '[]', '{}', '0001-01-01', '00:00:00',
    '00:00:00+14', '0001-01-01 00:00:00', '0001-01-01 00:00:00+00', '-178000000 years',
    '{}', '{}', '0.0.0.0', '0.0.0.0/0');
INSERT INTO zoo VALUES (3, 32767, 2147483647, 9223372036854775807,
    '1e-30', 99999999.9999, '3.4028235e38', '1.7976931348623157e308', true,
    'żółw 🐢 "quoted" it''s back\slash tab	end', 'ąę😀', 'ab',
    '\x00ff0a5c', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, "x"], "b": null}',
    '{"z": 1, "a": {"n": 1.50}}', '9999-12-31', '23:59:59.999999', '12:34:56.789+05:30',
    '9999-12-31 23:59:59.999999', '2024-03-10 02:30:00-08',
    '1 year 2 mons 3 days 04:05:06.789', '{1,NULL,-3}',
    '{"a,b","q\"uote",NULL,"","NULL","back\\slash"}', '2001:db8::1/64', '2001:db8::/32');
INSERT INTO zoo (id, n, n124, f4, f8, d, tm, ts, tstz)
    VALUES (4, 'NaN', 'NaN', 'NaN', 'NaN', 'infinity', '24:00:00', 'infinity', '-infinity');
INSERT INTO zoo (id, n, f4, f8, d, ts, tstz)
    VALUES (5, 'Infinity', 'Infinity', '-Infinity', '-infinity', '-infinity', 'infinity');
SET TimeZone = 'Asia/Kolkata';
INSERT INTO zoo (id, n, f4, f8, d, ts, tstz, ai, at)
    VALUES (6, '-Infinity', '1e-45', '5e-324', '0044-03-15 BC', '0044-03-15 12:00:00 BC',
            '2024-01-31 12:34:56.123456', '{{1,2},{3,4}}', '{żółw,🐢}');
SET TimeZone = 'America/New_York';
INSERT INTO zoo (id, n, n124, tstz, iv, at)
    VALUES (7, '0.000000000000000000000000000001', 0.0001, '2024-06-30 23:59:59.5',
            '-1 days +02:03:04', '{" lead"}');
RESET TimeZone;
INSERT INTO zoo (id, d, ts, tstz)
    VALUES (8, '5874897-12-31', '294276-12-31 23:59:59.999999', '294276-12-31 23:59:59.999999+00'),
           (9, '4713-01-01 BC', '4713-11-24 00:00:00 BC', '4713-11-24 00:00:00+00 BC'),
           (10, '4714-11-24 BC', '4714-11-24 00:00:00 BC', '4714-11-24 00:00:00+00 BC');
INSERT INTO zoo_enum VALUES (1, NULL, NULL), (2, 'happy 😀', '{}'),
    (3, 'it''s', '{sad,NULL,"happy 😀"}');
"#;

/// Streamed changes: copies of every row under new ids, then every original row takes the
/// values of the next one (so each edge value is also written by an UPDATE).
pub const CHANGES: &str = r#"
INSERT INTO zoo SELECT id + 100, i2, i4, i8, n, n124, f4, f8, b, t, vc, c, by, u, j, jb, d, tm,
    ttz, ts, tstz, iv, ai, at, ip, cn FROM zoo WHERE id < 100;
UPDATE zoo z SET (i2, i4, i8, n, n124, f4, f8, b, t, vc, c, by, u, j, jb, d, tm, ttz, ts, tstz,
    iv, ai, at, ip, cn) = (SELECT i2, i4, i8, n, n124, f4, f8, b, t, vc, c, by, u, j, jb, d, tm,
    ttz, ts, tstz, iv, ai, at, ip, cn FROM zoo s WHERE s.id = 100 + z.id % 10 + 1)
    WHERE z.id < 100;
INSERT INTO zoo_enum SELECT id + 100, m, ma FROM zoo_enum;
UPDATE zoo_enum SET m = 'sad', ma = '{ok,ok}' WHERE id = 1;
"#;

/// How a MySQL sink column is expected to hold a value (`docs/types.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The same text as PostgreSQL's.
    Same,
    /// A number MySQL holds in binary (DECIMAL, FLOAT, DOUBLE): NaN/±Infinity become NULL.
    Number,
    /// `char(n)`: MySQL strips trailing spaces.
    TrimEnd,
    /// `boolean`: `1`/`0`.
    Bool,
    /// `bytea`: compared as `\x…` hex.
    Bytes,
    /// JSON, compared as parsed JSON.
    Json,
    /// Dates and timestamps: infinite, BC and after-9999 values become NULL; `+00` is dropped.
    Temporal,
    /// Arrays: a JSON array, compared with PostgreSQL's `to_json` of the array.
    Array,
}

/// The expectation for each of [`COLUMNS`].
pub fn expect(column: &str) -> Expect {
    match column {
        "n124" | "f4" | "f8" => Expect::Number,
        "c" => Expect::TrimEnd,
        "b" => Expect::Bool,
        "by" => Expect::Bytes,
        "j" | "jb" => Expect::Json,
        "d" | "ts" | "tstz" => Expect::Temporal,
        "ai" | "at" => Expect::Array,
        _ => Expect::Same,
    }
}
