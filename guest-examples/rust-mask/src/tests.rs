use super::mask_text;

#[test]
fn masks_keep_first_char_and_domain() {
    assert_eq!(mask_text("alice@example.com"), "a***@example.com");
    assert_eq!(mask_text("Alice Smith"), "A***");
    assert_eq!(mask_text(""), "");
    assert_eq!(mask_text("é@x"), "é***@x");
}
