// Unicode's letters (\p{L}) and numbers (\p{N}) as the contents of PCRE2 character classes
// ("\x{41}-\x{5A}..."), generated from the regex engine of Hugging Face's tokenizers by
// scripts/gen_unicode_classes.py (Unicode 16; the system's PCRE2 may know an older Unicode).
#pragma once

namespace relay {

extern const char* const kUnicodeLetters;
extern const char* const kUnicodeNumbers;

}  // namespace relay
