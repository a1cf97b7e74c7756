// The documentation against the tree and the parser: every relative link in the repository's Markdown resolves (to a
// file or directory, and an #anchor to a heading of the .md it names); the configuration reference
// (docs/configuration.md) lists exactly the keys the parser accepts (relay::config_keys(), every family's [model] keys
// included); README.md stays a front page (at most 300 lines) that links every docs/*.md file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "model/family.hpp"

using namespace relay;
namespace fs = std::filesystem;

namespace {

const fs::path kRoot = fs::path(RELAY_SOURCE_DIR);

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::string rel(const fs::path& p) { return fs::relative(p, kRoot).generic_string(); }

// A fence line (``` or ~~~, up to three spaces of indentation) opens or closes a code block.
bool is_fence(const std::string& line) {
  size_t i = line.find_first_not_of(' ');
  return i != std::string::npos && i <= 3 && (line.compare(i, 3, "```") == 0 || line.compare(i, 3, "~~~") == 0);
}

// The file's lines with fenced code blocks blanked and, with code_spans, inline code spans (a run of n backticks up to
// the next run of n) replaced by "code", so that code yields no links or headings; line numbers are kept.
std::vector<std::string> prose_lines(const fs::path& p, bool code_spans = true) {
  std::vector<std::string> out;
  bool fenced = false;
  for (const std::string& line : lines_of(p)) {
    if (is_fence(line)) {
      fenced = !fenced;
      out.emplace_back();
      continue;
    }
    if (fenced || !code_spans) {
      out.push_back(fenced ? "" : line);
      continue;
    }
    std::string s;
    for (size_t i = 0; i < line.size();) {
      if (line[i] != '`') {
        s += line[i++];
        continue;
      }
      auto run_end = [&](size_t at) { return std::min(line.find_first_not_of('`', at), line.size()); };
      const size_t n = run_end(i) - i;
      size_t close = line.find('`', i + n);
      while (close != std::string::npos && run_end(close) - close != n)  // a run of another length
        close = line.find('`', run_end(close));
      const std::string ticks(n, '`');
      if (close == std::string::npos) {  // no closing run: literal backticks
        s += ticks;
        i += n;
      } else {
        s += "code";
        i = close + n;
      }
    }
    out.push_back(s);
  }
  return out;
}

// GitHub's anchor for a heading: lowercase; spaces become '-'; everything but letters, digits, '-' and '_' is
// dropped (non-ASCII too: the headings here are ASCII); the n-th repeat of a slug gets "-n".
std::set<std::string> heading_slugs(const fs::path& md) {
  std::set<std::string> slugs;
  std::map<std::string, int> seen;
  for (const std::string& line : prose_lines(md, /*code_spans=*/false)) {
    size_t level = line.find_first_not_of('#');
    if (level == 0 || level == std::string::npos || level > 6 || line[level] != ' ') continue;
    std::string text = line.substr(level + 1);
    while (!text.empty() && (text.back() == '#' || text.back() == ' ')) text.pop_back();  // a closing sequence
    std::string slug;
    for (unsigned char c : text) {
      if (std::isalnum(c) || c == '-' || c == '_') slug += char(std::tolower(c));
      else if (c == ' ') slug += '-';
    }
    const int n = seen[slug]++;
    slugs.insert(n == 0 ? slug : slug + "-" + std::to_string(n));
  }
  return slugs;
}

struct Link {
  int line;
  std::string target;
};

// Inline links and images, [text](target) and ![alt](target "title"), outside code: the "](target)" part, so that
// a link whose text wraps onto the next line is found on the line that holds its target.
std::vector<Link> links_of(const fs::path& md) {
  static const std::regex link(R"(\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\))");
  std::vector<Link> out;
  const std::vector<std::string> lines = prose_lines(md);
  for (size_t i = 0; i < lines.size(); ++i)
    for (std::sregex_iterator it(lines[i].begin(), lines[i].end(), link), end; it != end; ++it)
      out.push_back({int(i + 1), (*it)[1].str()});
  return out;
}

bool external(const std::string& target) {
  for (const char* scheme : {"http://", "https://", "mailto:"})
    if (target.rfind(scheme, 0) == 0) return true;
  return false;
}

// Every Markdown file of the checkout, outside build*/ and hidden directories.
std::vector<fs::path> markdown_files() {
  std::vector<fs::path> out;
  for (auto it = fs::recursive_directory_iterator(kRoot); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory()) {
      if (name.rfind("build", 0) == 0 || name.rfind(".", 0) == 0) it.disable_recursion_pending();
    } else if (it->path().extension() == ".md") {
      out.push_back(it->path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(Docs, EveryRelativeLinkResolves) {
  const std::vector<fs::path> files = markdown_files();
  ASSERT_TRUE(std::find(files.begin(), files.end(), kRoot / "README.md") != files.end()) << "no README.md in " << kRoot;
  std::map<fs::path, std::set<std::string>> slugs;  // per target file, computed once
  int checked = 0;
  for (const fs::path& md : files) {
    for (const Link& l : links_of(md)) {
      if (external(l.target)) continue;
      const size_t hash = l.target.find('#');
      const std::string path = l.target.substr(0, hash);
      const std::string anchor = hash == std::string::npos ? "" : l.target.substr(hash + 1);
      const fs::path target = path.empty() ? md : (md.parent_path() / path).lexically_normal();
      const std::string where = rel(md) + ":" + std::to_string(l.line) + ": link (" + l.target + ")";
      ++checked;
      if (!fs::exists(target)) {
        ADD_FAILURE() << where << ": " << rel(target) << " does not exist";
        continue;
      }
      if (anchor.empty() || target.extension() != ".md") continue;
      if (!slugs.count(target)) slugs[target] = heading_slugs(target);
      if (!slugs[target].count(anchor))
        ADD_FAILURE() << where << ": " << rel(target) << " has no heading whose anchor is #" << anchor;
    }
  }
  EXPECT_GT(checked, 0) << "no relative links found in " << files.size() << " Markdown files";
}

TEST(Docs, ReferenceListsExactlyTheAcceptedKeys) {
  const fs::path ref = kRoot / "docs" / "configuration.md";
  ASSERT_TRUE(fs::exists(ref)) << rel(ref) << " is missing";
  // The keys named in the first cell of the reference's table rows: `section.key` in backticks.
  static const std::regex key(R"(`([a-z_]+\.[a-z0-9_]+)`)");
  std::set<std::string> listed;
  bool fenced = false;
  for (const std::string& line : lines_of(ref)) {
    if (is_fence(line)) fenced = !fenced;
    if (fenced || line.empty() || line[0] != '|') continue;
    size_t end = 1;
    while (end < line.size() && !(line[end] == '|' && line[end - 1] != '\\')) ++end;
    const std::string cell = line.substr(1, end - 1);
    for (std::sregex_iterator it(cell.begin(), cell.end(), key), e; it != e; ++it) listed.insert((*it)[1].str());
  }
  const std::vector<std::string> keys = config_keys();
  ASSERT_FALSE(keys.empty());
  const std::set<std::string> accepted(keys.begin(), keys.end());
  for (const std::string& k : accepted)
    EXPECT_TRUE(listed.count(k)) << "docs/configuration.md does not list parser key " << k;
  for (const std::string& k : listed)
    EXPECT_TRUE(accepted.count(k)) << "docs/configuration.md lists " << k << ", which the parser does not accept";
}

TEST(Docs, ReadmeIsAFrontPage) {
  const fs::path readme = kRoot / "README.md";
  const size_t n = lines_of(readme).size();
  EXPECT_LE(n, 300u) << "README.md has " << n << " lines; the front page keeps to 300 and the rest lives in docs/";
  std::set<fs::path> linked;
  for (const Link& l : links_of(readme))
    if (!external(l.target))
      linked.insert((kRoot / l.target.substr(0, l.target.find('#'))).lexically_normal());
  ASSERT_TRUE(fs::is_directory(kRoot / "docs")) << "docs/ is missing";
  int docs = 0;
  for (const auto& e : fs::directory_iterator(kRoot / "docs")) {
    if (e.path().extension() != ".md") continue;
    ++docs;
    EXPECT_TRUE(linked.count(e.path().lexically_normal())) << "README.md does not link " << rel(e.path());
  }
  EXPECT_GT(docs, 0) << "docs/ holds no Markdown files";
}
