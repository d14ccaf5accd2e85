package dsml

import (
	"strings"
	"testing"
)

// BenchmarkParseStream feeds a reasoning + text + tool-call turn in small
// pieces, as a decoder would.
func BenchmarkParseStream(b *testing.B) {
	body := strings.Repeat("func main() {\n\tfmt.Println(\"héllo, 世界\") // <tag> & more\n}\n", 400)
	out := strings.Repeat("thinking about it. ", 200) + "</think>Writing the file.\n\n" +
		blk + "\n" + inv + ` name="write">` + "\n" +
		par + ` name="path" string="true">main.go` + parE + "\n" +
		par + ` name="content" string="true">` + body + parE + "\n" +
		par + ` name="mode" string="false">{"perm": 420, "sync": true}` + parE + "\n" +
		invE + "\n" + blkE
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		p := NewParser(Options{Thinking: true})
		for i := 0; i < len(out); i += 4 {
			p.Feed(out[i:min(i+4, len(out))])
		}
		p.Finish()
	}
}
