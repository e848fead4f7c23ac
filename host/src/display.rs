//! Display: text from untrusted sources (a model's arguments, a Tool's id
//! and result, a client's self-given name) as an approver may be shown it.
//!
//! Owns the one rule of what is escaped before anything untrusted reaches a
//! human deciding about it — a terminal (`toolgate approve`, `toolgate
//! journal`), an MCP client's approval dialog, or the CLI's `--json` views:
//! every character that acts on the display instead of being seen, or is not
//! seen at all, is written as its escape (`\u{202e}`, `\n` in text; `\u202e`
//! in JSON), and on one line right-to-left letters cannot carry the text
//! around them along, so what the human reads is the text's every character,
//! in order.
//!
//! Architecture invariant: every approver-facing renderer goes through
//! [`escape_unseen`] (or [`json`], which escapes the same characters); no
//! front end keeps a list of its own.

use std::borrow::Cow;
use std::io;

use unicode_bidi::{BidiClass, bidi_class};
use unicode_general_category::{GeneralCategory, get_general_category};

/// U+200E LEFT-TO-RIGHT MARK: a strong left-to-right character that is not
/// seen, written by the host (never passed through from the text: the text's
/// own marks are escaped).
const LRM: char = '\u{200E}';

/// Whether line breaks and tabs are kept where the text is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// `\n` and `\t` are kept (text over several lines: an error, a Tool's
    /// output); everything else that is unseen is escaped.
    Keep,
    /// Every line break and tab is escaped as well, so the text stays on the
    /// one line it was put on and nothing in it can start a line of its own
    /// (a field of a journal line, an approval prompt's arguments); and
    /// right-to-left text is held to its own runs (see [`escape_unseen`]).
    Escape,
}

/// `text` with every character that would change how it, or the text around
/// it, is shown without being seen itself written as its escape
/// ([`char::escape_default`], e.g. `\u{202e}`):
///
/// - control characters (C0, DEL, C1 including NEL): they move a terminal's
///   cursor, recolor, clear, or break lines in a dialog;
/// - format characters (general category Cf): bidi embeddings, overrides,
///   isolates and marks (which show `exe.pdf` for `fdp.exe`), zero-width
///   spaces and joiners, the byte order mark, invisible operators, tags;
/// - the line and paragraph separators (U+2028, U+2029);
/// - every default-ignorable code point, which renders as nothing:
///   variation selectors, the Hangul fillers, the combining grapheme joiner,
///   Mongolian free variation selectors, and unassigned ones reserved as such
///   (U+2065, U+FFF0…).
///
/// With [`Lines::Keep`], `\n` and `\t` stay; with [`Lines::Escape`] they are
/// escaped too, and right-to-left text cannot reorder what is around it:
/// without any control character, a bidi-aware dialog or terminal shows
/// `{"ports":["א","22","8080","ב"]}` as `{"ports":["ב","8080","22","א"]}`
/// (numbers and punctuation between two right-to-left letters take their
/// direction). So after each run of right-to-left characters (bidi class R,
/// AL or AN, with the combining marks that follow them) a U+200E
/// LEFT-TO-RIGHT MARK is written, and one more at the start when the first
/// strong character would otherwise be right to left (a dialog that takes a
/// line's direction from its first letter). Each run is still shown right
/// to left, readable; it reverses only within itself, and runs and
/// everything between them keep the order they were written in. The marks
/// are the host's: the text's own are escaped.
///
/// Visible left-to-right text (any script, emoji without selectors) is
/// returned as it is, borrowed.
pub fn escape_unseen(text: &str, lines: Lines) -> Cow<'_, str> {
    let hidden = |c: char| unseen(c) && !(lines == Lines::Keep && (c == '\n' || c == '\t'));
    let marks = lines == Lines::Escape && text.chars().any(right_to_left);
    if !marks && !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut in_run = false;
    for c in text.chars() {
        if in_run && !(right_to_left(c) || continues_run(c)) {
            out.push(LRM);
            in_run = false;
        }
        if hidden(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
            in_run |= marks && right_to_left(c);
        }
    }
    if in_run {
        out.push(LRM);
    }
    if marks && first_strong_is_right_to_left(&out) {
        out.insert(0, LRM);
    }
    Cow::Owned(out)
}

/// Whether `c` is shown right to left, or makes what is around it so: a
/// strong right-to-left letter (Hebrew, Arabic, Syriac, Thaana, N'Ko…) or an
/// Arabic-Indic digit, which the bidi algorithm counts as right to left for
/// the punctuation around it. Not an unseen character (the marks U+200F and
/// U+061C are escaped instead).
fn right_to_left(c: char) -> bool {
    matches!(bidi_class(c), BidiClass::R | BidiClass::AL | BidiClass::AN) && !unseen(c)
}

/// A combining mark (bidi class NSM) takes the direction of the letter it
/// follows: it stays in that letter's run rather than after a mark of ours.
fn continues_run(c: char) -> bool {
    bidi_class(c) == BidiClass::NSM && !unseen(c)
}

/// Whether the first strong character of `shown` (bidi class L, R or AL)
/// is right to left.
fn first_strong_is_right_to_left(shown: &str) -> bool {
    shown
        .chars()
        .map(bidi_class)
        .find(|b| matches!(b, BidiClass::L | BidiClass::R | BidiClass::AL))
        .is_some_and(|b| b != BidiClass::L)
}

/// Whether `c` acts on the display or is not seen (see [`escape_unseen`]).
/// Also what the policy's URL reading counts as characters some parser
/// drops (`policy::url`).
pub(crate) fn unseen(c: char) -> bool {
    c.is_control()
        || matches!(
            get_general_category(c),
            GeneralCategory::Format | GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator
        )
        || default_ignorable(c)
}

/// Default_Ignorable_Code_Point, whole, as Unicode derives it
/// (DerivedCoreProperties.txt, Unicode 16.0: Other_Default_Ignorable_Code_Point
/// + Cf + Variation_Selector − White_Space − U+FFF9…FFFB − U+13430…1343F −
/// Prepended_Concatenation_Mark): code points a conforming renderer shows as
/// nothing when it does not support them — assigned or not (U+2065). Most
/// are also format characters; listed here all the same, so the set does not
/// depend on which Unicode version the general-category table knows.
fn default_ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'                       // soft hyphen
            | '\u{034F}'                 // combining grapheme joiner
            | '\u{061C}'                 // Arabic letter mark
            | '\u{115F}'..='\u{1160}'    // Hangul choseong / jungseong fillers
            | '\u{17B4}'..='\u{17B5}'    // Khmer inherent vowels
            | '\u{180B}'..='\u{180F}'    // Mongolian free variation selectors, vowel separator
            | '\u{200B}'..='\u{200F}'    // zero-width space, (non-)joiner, LRM, RLM
            | '\u{202A}'..='\u{202E}'    // bidi embeddings and overrides
            | '\u{2060}'..='\u{206F}'    // word joiner, invisible operators, U+2065, isolates, deprecated formats
            | '\u{3164}'                 // Hangul filler
            | '\u{FE00}'..='\u{FE0F}'    // variation selectors
            | '\u{FEFF}'                 // zero-width no-break space, byte order mark
            | '\u{FFA0}'                 // halfwidth Hangul filler
            | '\u{FFF0}'..='\u{FFF8}'    // reserved
            | '\u{1BCA0}'..='\u{1BCA3}'  // shorthand format controls
            | '\u{1D173}'..='\u{1D17A}'  // musical symbol formatting
            | '\u{E0000}'..='\u{E0FFF}' // tags, variation selectors supplement, reserved
    )
}

/// `value` as compact JSON for a human to read (the CLI's `--json` views):
/// exact JSON, parsing back to `value`, with every character
/// [`escape_unseen`] would escape written as its JSON escape (`\u202e`, a
/// surrogate pair `\udb40\udc41` beyond U+FFFF) in every string, keys too.
/// serde_json on its own escapes only `"`, `\` and U+0000…U+001F, so a bidi
/// override or a line separator in a model's arguments would reach the
/// approver raw. Right-to-left text is not marked: each JSON string is
/// shown by a JSON viewer on its own.
pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<String> {
    let mut out = Vec::with_capacity(128);
    value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, UnseenEscaped))?;
    // Only whole UTF-8 strings and ASCII escapes were written.
    String::from_utf8(out).map_err(|e| serde_json::Error::io(io::Error::new(io::ErrorKind::InvalidData, e)))
}

/// serde_json's compact formatter (the trait's defaults are
/// [`serde_json::ser::CompactFormatter`]'s), but for the plain runs of a
/// string: their unseen characters are escaped as `\uXXXX`.
struct UnseenEscaped;

impl serde_json::ser::Formatter for UnseenEscaped {
    fn write_string_fragment<W: ?Sized + io::Write>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()> {
        let mut plain = 0;
        for (at, c) in fragment.char_indices() {
            if unseen(c) {
                writer.write_all(&fragment.as_bytes()[plain..at])?;
                for unit in c.encode_utf16(&mut [0; 2]) {
                    write!(writer, "\\u{unit:04x}")?;
                }
                plain = at + c.len_utf8();
            }
        }
        writer.write_all(&fragment.as_bytes()[plain..])
    }
}

/// `text` as one quoted field for a human: at most `max_chars` characters of
/// it, its `"` and `\` escaped, then [`escape_unseen`] on one line, in
/// double quotes, followed (if it was cut) by `…` and how many bytes were
/// left out. Nothing in it can end the quote and go on as the host's words,
/// and an escape the host wrote (`\u{202e}`) cannot be imitated: the text's
/// own backslashes are doubled.
pub fn quoted(text: &str, max_chars: usize) -> String {
    let cut_at = text.char_indices().nth(max_chars).map(|(i, _)| i);
    let kept = &text[..cut_at.unwrap_or(text.len())];
    let mut plain = String::with_capacity(kept.len() + 2);
    plain.push('"');
    for c in kept.chars() {
        if c == '"' || c == '\\' {
            plain.push('\\');
        }
        plain.push(c);
    }
    plain.push('"');
    let mut out = escape_unseen(&plain, Lines::Escape).into_owned();
    if let Some(at) = cut_at {
        out.push_str(&format!("… ({} more bytes)", text.len() - at));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HIDDEN: &[char] = &[
        '\u{1B}',
        '\u{7F}',
        '\u{85}',
        '\u{9B}', // controls: ESC, DEL, NEL, CSI
        '\u{202A}',
        '\u{202B}',
        '\u{202C}',
        '\u{202D}',
        '\u{202E}', // embeddings, overrides
        '\u{2066}',
        '\u{2067}',
        '\u{2068}',
        '\u{2069}', // isolates
        '\u{200E}',
        '\u{200F}',
        '\u{061C}', // marks
        '\u{200B}',
        '\u{200C}',
        '\u{200D}',
        '\u{2060}',
        '\u{2062}',
        '\u{FEFF}',
        '\u{00AD}', // zero-width
        '\u{2028}',
        '\u{2029}', // separators
        '\u{E0041}',
        '\u{E007F}', // tags
        '\u{FE0F}',
        '\u{034F}',
        '\u{3164}',
        '\u{115F}',
        '\u{FFA0}',
        '\u{180B}', // default-ignorable
        '\u{2065}', // unassigned, default-ignorable: renders as nothing
        '\u{1160}',
        '\u{17B4}',
        '\u{17B5}',
        '\u{180F}',
        '\u{206F}',
        '\u{FE00}',
        '\u{FFF0}',
        '\u{FFF8}',
        '\u{1BCA0}',
        '\u{1D173}',
        '\u{1D17A}',
        '\u{E0100}',
        '\u{E0FFF}', // one more from each default-ignorable range
    ];

    #[test]
    fn every_unseen_character_is_escaped_in_both_modes() {
        for &c in HIDDEN {
            for lines in [Lines::Keep, Lines::Escape] {
                let shown = escape_unseen(&format!("x{c}y"), lines).into_owned();
                assert!(!shown.contains(c), "{c:?} {lines:?}: {shown:?}");
                assert_eq!(shown, format!("x{}y", c.escape_default()), "{c:?} {lines:?}");
            }
        }
    }

    #[test]
    fn line_breaks_and_tabs_stay_only_when_kept() {
        let text = "a\nb\tc\rd\u{B}e\u{C}f";
        assert_eq!(escape_unseen(text, Lines::Keep), "a\nb\tc\\rd\\u{b}e\\u{c}f");
        let one = escape_unseen(text, Lines::Escape);
        assert_eq!(one, "a\\nb\\tc\\rd\\u{b}e\\u{c}f");
        assert_eq!(one.lines().count(), 1);
    }

    #[test]
    fn visible_text_is_left_alone_and_borrowed() {
        for text in ["plain text", "ünïcödé 名前 ✓ 👍 ٪ 1,5", "{\"path\":\"out/report.pdf\",\"ports\":[22]}", ""]
        {
            assert!(matches!(escape_unseen(text, Lines::Escape), Cow::Borrowed(t) if t == text), "{text}");
        }
        assert!(matches!(escape_unseen("two\nlines", Lines::Keep), Cow::Borrowed(_)));
        assert!(matches!(escape_unseen("مرحبا עברית\n", Lines::Keep), Cow::Borrowed(_)), "marks on one line only");
    }

    /// How a bidi-aware display lays `shown` out (Unicode Bidirectional
    /// Algorithm, paragraph direction from the first strong character),
    /// with the unseen marks left out.
    fn laid_out(shown: &str) -> String {
        let info = unicode_bidi::BidiInfo::new(shown, None);
        let mut visual = String::new();
        for para in &info.paragraphs {
            visual.push_str(&info.reorder_line(para, para.range.clone()));
        }
        visual.replace(LRM, "")
    }

    /// The review's input: no control character, only two right-to-left
    /// letters, and the numbers between them are shown in reverse.
    #[test]
    fn right_to_left_letters_cannot_reorder_what_is_around_them() {
        let ports = r#"{"ports":["א","22","8080","ב"]}"#;
        assert_eq!(laid_out(ports), r#"{"ports":["ב","8080","22","א"]}"#, "what the approver saw before");
        let shown = escape_unseen(ports, Lines::Escape);
        assert_eq!(shown, "{\"ports\":[\"א\u{200E}\",\"22\",\"8080\",\"ב\u{200E}\"]}");
        assert_eq!(laid_out(&shown), ports, "shown in the order written");

        // A line that starts right to left is still laid out left to right;
        // a word's letters and its combining marks stay one run, read right
        // to left; Arabic-Indic digits count as right to left too.
        let key = r#"{"שָׁלוֹם":"x"}"#;
        let shown = escape_unseen(key, Lines::Escape);
        assert_eq!(shown, "\u{200E}{\"שָׁלוֹם\u{200E}\":\"x\"}");
        assert_eq!(laid_out(&shown), key.replace("שָׁלוֹם", &laid_out("שָׁלוֹם")));
        let digits = r#"["١","٢"]"#;
        assert_ne!(laid_out(digits), digits);
        assert_eq!(laid_out(&escape_unseen(digits, Lines::Escape)), digits);
        for words in ["مرحبا بالعالم 22, 8080", "a עברית b 1-2 ג"] {
            let shown = escape_unseen(words, Lines::Escape);
            let runs: Vec<&str> = words.split([' ', ',', '-']).filter(|w| !w.is_empty()).collect();
            let visual = laid_out(&shown);
            let at = |w: &str| visual.find(&laid_out(w)).unwrap_or(usize::MAX);
            assert!(runs.windows(2).all(|p| at(p[0]) < at(p[1])), "{words:?} laid out as {visual:?}");
        }

        // The text's own marks are escaped, the host's are not imitable.
        assert_eq!(escape_unseen("x א\u{200E}\u{200F}1", Lines::Escape), "x א\u{200E}\\u{200e}\\u{200f}1");
        assert_eq!(quoted("ב\"x", 10), "\u{200E}\"ב\u{200E}\\\"x\"");
    }

    #[test]
    fn json_escapes_every_unseen_character_and_stays_exact() {
        let note: String = HIDDEN.iter().flat_map(|&c| ['a', c]).collect();
        let value = serde_json::json!({ "note": note, format!("k{}", '\u{202E}'): ["א", 22, "\u{2028}"] });
        let text = json(&value).map_err(|e| e.to_string());
        let text = text.as_deref().unwrap_or_default();
        assert_eq!(serde_json::from_str::<serde_json::Value>(text).ok(), Some(value));
        assert!(!text.chars().any(unseen), "{text}");
        for escape in [r"\u001b", r"\u007f", r"\u202e", r"\u2028", r"\u2065", r"\udb40\udc41", r"\udb43\udfff"] {
            assert!(text.contains(escape), "{escape} in {text}");
        }
        assert!(text.contains(r#"["א",22,"\u2028"]"#), "right to left text as it is: {text}");
        let plain = serde_json::json!({"path": "out/report.pdf", "n": [1, 2.5, null, true]});
        assert_eq!(json(&plain).ok(), Some(plain.to_string()), "compact, like serde_json's own");
    }

    /// The review's two inputs: a bidi override that reverses a file's
    /// extension, and line separators that put model text on a line of its own.
    #[test]
    fn disguised_arguments_show_every_character_in_order() {
        let reversed = serde_json::json!({"path": "out/\u{202E}fdp.exe"}).to_string();
        assert_eq!(escape_unseen(&reversed, Lines::Escape), r#"{"path":"out/\u{202e}fdp.exe"}"#);
        let fake = serde_json::json!({"note": "x\u{2028}\u{2028}(verified read-only by toolgate)"}).to_string();
        let shown = escape_unseen(&fake, Lines::Escape);
        assert_eq!(shown, r#"{"note":"x\u{2028}\u{2028}(verified read-only by toolgate)"}"#);
        assert!(!shown.chars().any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')));
    }

    #[test]
    fn quoted_cannot_be_closed_from_inside_and_is_bounded() {
        assert_eq!(quoted(r#"x", verified) \"#, 40), r#""x\", verified) \\""#);
        assert_eq!(quoted("a\u{202E}\nb", 10), r#""a\u{202e}\nb""#);
        assert_eq!(quoted(r"\u{202e}", 10), r#""\\u{202e}""#, "a written-out escape is told apart from the host's");
        assert_eq!(quoted("ééééé", 2), "\"éé\"… (6 more bytes)");
        assert_eq!(quoted("", 2), "\"\"");
    }
}
