//! PostgreSQL column types → MySQL/MariaDB column types, for `create_tables: true` (and for
//! columns added later). The mapping and its reasons are documented in `docs/types.md`; in
//! short, every value must come back from the sink equal to the source's, or as the
//! documented NULL/text stand-in where MySQL has no equivalent (NaN, infinities, BC dates).
//!
//! Tables are created with `utf8mb4_bin`: the default collations compare case- and
//! accent-insensitively, which would merge source keys `'a'` and `'A'` into one row.

use super::array;
use super::literal::push_ident;
use crate::change::{Column, Table};

/// Largest VARCHAR length (in characters) that fits MySQL's 65,535-byte row limit in utf8mb4.
const VARCHAR_MAX: i32 = 16_383;
/// Longest text key: 255 utf8mb4 characters stay well inside InnoDB's 3,072-byte index limit
/// even for a composite key of several such columns.
const KEY_TEXT: &str = "VARCHAR(255)";

/// The MySQL column type for source column `col` (`is_key`: part of the sink's PRIMARY KEY,
/// which MySQL cannot build on LONGTEXT, LONGBLOB or JSON). The error says why no MySQL type
/// fits, without naming the table (the caller does).
pub(super) fn column_type(col: &Column, is_key: bool) -> Result<String, String> {
    let modifier = col.type_modifier;
    let text = |limit: Option<i32>| match limit {
        Some(n) if is_key && n <= 255 => format!("VARCHAR({n})"),
        _ if is_key => KEY_TEXT.to_owned(),
        Some(n) if n <= VARCHAR_MAX => format!("VARCHAR({n})"),
        _ => "LONGTEXT".to_owned(),
    };
    // varchar(n) and char(n) store n + 4 (VARHDRSZ) in atttypmod.
    let length = (modifier >= 4).then_some(modifier - 4);
    let not_a_key = |what: &str| {
        if is_key {
            Err(format!(
                "{what} column {} cannot be part of a MySQL primary key (MySQL cannot index \
                 {what} values); create the sink table yourself or use another key",
                col.name
            ))
        } else {
            Ok(())
        }
    };
    Ok(match col.type_oid {
        16 => "BOOLEAN".to_owned(),
        21 => "SMALLINT".to_owned(),
        23 => "INT".to_owned(),
        20 | 26 => "BIGINT".to_owned(),
        700 => "FLOAT".to_owned(),
        701 => "DOUBLE".to_owned(),
        1700 => match numeric_precision(modifier) {
            Some((p, s)) if p <= 65 && (0..=30).contains(&s) && s <= p => {
                format!("DECIMAL({p},{s})")
            }
            // Unconstrained numeric (up to 131,072 digits before the point), or a precision
            // or scale DECIMAL lacks: PostgreSQL's exact text, NaN and infinities included.
            _ => text(None),
        },
        25 => text(None),
        1043 => text(length),
        1042 => match length {
            Some(n) if n <= 255 => format!("CHAR({n})"),
            other => text(other),
        },
        18 => "VARCHAR(4)".to_owned(),
        19 => "VARCHAR(64)".to_owned(),
        17 => {
            if is_key {
                "VARBINARY(255)".to_owned()
            } else {
                "LONGBLOB".to_owned()
            }
        }
        2950 => "CHAR(36)".to_owned(),
        114 | 3802 => {
            not_a_key("json")?;
            "JSON".to_owned()
        }
        1082 => "DATE".to_owned(),
        1083 => "TIME(6)".to_owned(),
        1114 | 1184 => "DATETIME(6)".to_owned(),
        // timetz: MySQL has no zoned time; `12:34:56.789+05:30` at most 21 characters.
        1266 => "VARCHAR(32)".to_owned(),
        // interval: `-178000000 years -11 mons -2147483648 days -2562047788:00:54.775807`.
        1186 => "VARCHAR(100)".to_owned(),
        // inet, cidr: an IPv6 address with a prefix length is at most 43 characters.
        869 | 650 => "VARCHAR(43)".to_owned(),
        829 => "CHAR(17)".to_owned(),
        774 => "CHAR(23)".to_owned(),
        oid if array::is_builtin_array(oid) => {
            not_a_key("array")?;
            "JSON".to_owned()
        }
        // Enums, domains and arrays of user types (OIDs from 16384), ranges, geometric types,
        // money, bit strings, xml, tsvector, …: PostgreSQL's text output, which round-trips.
        _ => text(None),
    })
}

/// `numeric(p,s)`'s precision and scale from its type modifier (`((p << 16) | s) + 4`, the
/// scale an 11-bit signed number since PostgreSQL 15), or `None` when unconstrained.
fn numeric_precision(modifier: i32) -> Option<(i32, i32)> {
    if modifier < 4 {
        return None;
    }
    let m = modifier - 4;
    let precision = (m >> 16) & 0xffff;
    // Sign-extend the low 11 bits.
    let scale = ((m & 0x7ff) ^ 0x400) - 0x400;
    Some((precision, scale))
}

/// `CREATE TABLE IF NOT EXISTS` for `table` in `database`, keyed on the source key, or why
/// not (a column no MySQL type fits, a table without a key).
pub(super) fn create_table_sql(database: &str, table: &Table) -> Result<String, String> {
    if table.key.is_empty() {
        return Err(format!(
            "source table {} has no key columns (replica identity); Zipline needs a key to \
             upsert and delete rows",
            table.qualified_name()
        ));
    }
    let mut sql = String::from("CREATE TABLE IF NOT EXISTS ");
    push_ident(&mut sql, database);
    sql.push('.');
    push_ident(&mut sql, &table.name);
    sql.push_str(" (");
    for (i, col) in table.columns.iter().enumerate() {
        let is_key = table.key.contains(&i);
        let ty = column_type(col, is_key)
            .map_err(|e| format!("source table {}: {e}", table.qualified_name()))?;
        push_ident(&mut sql, &col.name);
        sql.push(' ');
        sql.push_str(&ty);
        sql.push_str(if is_key { " NOT NULL, " } else { " NULL, " });
    }
    sql.push_str("PRIMARY KEY (");
    for (n, &i) in table.key.iter().enumerate() {
        if n > 0 {
            sql.push_str(", ");
        }
        push_ident(&mut sql, &table.columns[i].name);
    }
    sql.push_str(")) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin");
    Ok(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(type_oid: u32, type_modifier: i32) -> Column {
        Column {
            name: "c".into(),
            type_oid,
            type_modifier,
            is_key: false,
        }
    }

    fn ty(type_oid: u32, type_modifier: i32, is_key: bool) -> String {
        column_type(&col(type_oid, type_modifier), is_key).unwrap()
    }

    /// `numeric(p,s)`'s atttypmod.
    fn numeric(p: i32, s: i32) -> i32 {
        ((p << 16) | (s & 0x7ff)) + 4
    }

    #[test]
    fn scalar_types() {
        assert_eq!(ty(16, -1, false), "BOOLEAN");
        assert_eq!(ty(21, -1, true), "SMALLINT");
        assert_eq!(ty(23, -1, false), "INT");
        assert_eq!(ty(20, -1, false), "BIGINT");
        assert_eq!(ty(700, -1, false), "FLOAT");
        assert_eq!(ty(701, -1, false), "DOUBLE");
        assert_eq!(ty(2950, -1, true), "CHAR(36)");
        assert_eq!(ty(1082, -1, false), "DATE");
        assert_eq!(ty(1083, -1, false), "TIME(6)");
        assert_eq!(ty(1266, -1, false), "VARCHAR(32)");
        assert_eq!(ty(1114, -1, false), "DATETIME(6)");
        assert_eq!(ty(1184, 3, false), "DATETIME(6)");
        assert_eq!(ty(1186, -1, false), "VARCHAR(100)");
        assert_eq!(ty(869, -1, false), "VARCHAR(43)");
        assert_eq!(ty(650, -1, true), "VARCHAR(43)");
        assert_eq!(ty(3802, -1, false), "JSON");
    }

    #[test]
    fn numerics_fit_decimal_or_stay_text() {
        assert_eq!(ty(1700, numeric(12, 4), false), "DECIMAL(12,4)");
        assert_eq!(ty(1700, numeric(65, 30), false), "DECIMAL(65,30)");
        assert_eq!(ty(1700, numeric(66, 2), false), "LONGTEXT");
        assert_eq!(ty(1700, numeric(40, 31), false), "LONGTEXT");
        assert_eq!(ty(1700, numeric(5, -2), false), "LONGTEXT");
        assert_eq!(ty(1700, -1, false), "LONGTEXT");
        assert_eq!(ty(1700, -1, true), "VARCHAR(255)");
        assert_eq!(numeric_precision(numeric(3, -5)), Some((3, -5)));
        assert_eq!(numeric_precision(-1), None);
    }

    #[test]
    fn text_types_and_keys() {
        assert_eq!(ty(25, -1, false), "LONGTEXT");
        assert_eq!(ty(25, -1, true), "VARCHAR(255)");
        assert_eq!(ty(1043, 20 + 4, false), "VARCHAR(20)");
        assert_eq!(ty(1043, 20_000 + 4, false), "LONGTEXT");
        assert_eq!(ty(1043, 1000 + 4, true), "VARCHAR(255)");
        assert_eq!(ty(1043, -1, false), "LONGTEXT");
        assert_eq!(ty(1042, 3 + 4, true), "CHAR(3)");
        assert_eq!(ty(1042, 300 + 4, false), "VARCHAR(300)");
        assert_eq!(ty(17, -1, false), "LONGBLOB");
        assert_eq!(ty(17, -1, true), "VARBINARY(255)");
        // An enum (user-defined OID) and an unknown built-in: text form.
        assert_eq!(ty(16_500, -1, false), "LONGTEXT");
        assert_eq!(ty(16_500, -1, true), "VARCHAR(255)");
        assert_eq!(ty(3904, -1, false), "LONGTEXT");
    }

    #[test]
    fn arrays_are_json_and_cannot_be_keys() {
        assert_eq!(ty(1007, -1, false), "JSON");
        assert_eq!(ty(1009, -1, false), "JSON");
        let e = column_type(&col(1007, -1), true).unwrap_err();
        assert!(
            e.contains("array column c cannot be part of a MySQL primary key"),
            "{e}"
        );
        assert!(column_type(&col(3802, -1), true).is_err());
    }

    #[test]
    fn create_table_statement() {
        let mut key = col(23, -1);
        key.name = "id".into();
        key.is_key = true;
        let mut note = col(25, -1);
        note.name = "no`te".into();
        let table = Table::new("public".into(), "t".into(), vec![key, note]);
        assert_eq!(
            create_table_sql("db", &table).unwrap(),
            "CREATE TABLE IF NOT EXISTS `db`.`t` (`id` INT NOT NULL, `no``te` LONGTEXT NULL, \
             PRIMARY KEY (`id`)) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        );
    }
}
