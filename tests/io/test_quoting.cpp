// The one quoting rule of messages (docs/errors.md, "Quoting"): detail::quoted for text read from
// a file, detail::quoted_path for a path (the same rule, never cut). Every quoted text reads back
// as exactly one byte string: the quote and the backslash are escaped as well as control bytes and
// bytes that are not UTF-8.
#include <gtest/gtest.h>

#include <string>

#include "core/check.hpp"

namespace {

// Qualified: for a std::string argument, ADL would find std::quoted.


TEST(Quoting, AQuoteOrABackslashInAPathCannotEndTheQuotesOrPassForAnEscape) {
    // Plain quotes gave 'it's.npy' (where does the name end?) and could not tell a file named
    // a\x0a.npy from one whose name holds a newline.
    EXPECT_EQ(attn::detail::quoted_path("it's.npy"), R"('it\'s.npy')");
    EXPECT_EQ(attn::detail::quoted_path(R"(a\x0a.npy)"), R"('a\\x0a.npy')");
    EXPECT_EQ(attn::detail::quoted_path("a\nb.npy"), R"('a\x0ab.npy')");
    EXPECT_EQ(attn::detail::quoted_path("\xff.npy"), R"('\xff.npy')");
    EXPECT_EQ(attn::detail::quoted_path("d/\xc3\xa9t\xc3\xa9.npy"), "'d/\xc3\xa9t\xc3\xa9.npy'");  // UTF-8 is kept as it is
}

TEST(Quoting, APathIsShownWholeTextFromAFileIsCut) {
    const std::string long_path = "/" + std::string(300, 'd') + "/o.npy";
    EXPECT_EQ(attn::detail::quoted_path(long_path), "'" + long_path + "'");
    EXPECT_EQ(attn::detail::quoted(std::string(100, 'n')), "'" + std::string(80, 'n') + "...'");
    EXPECT_EQ(attn::detail::quoted("it's"), R"('it\'s')");  // file text follows the same rule
}

}  // namespace
