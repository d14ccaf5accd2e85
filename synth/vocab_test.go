package synth

import (
	"slices"
	"testing"

	"ds4go/chat"
	"ds4go/tokenizer"
)

func TestSmallVocab(t *testing.T) {
	minN, err := MinSmallVocab()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("smallest vocabulary: %d", minN)
	if _, err := SmallVocab(minN - 1); err == nil {
		t.Errorf("SmallVocab(%d) accepted", minN-1)
	}
	texts := []string{
		"Hello, world! The quick brown fox jumps over the lazy dog 12345.",
		"  indented\n\ttabs\r\nand   spaces  ",
		"中文测试，日本語のテキスト、한국어 🙂 émoji \x00\xff bytes",
		"func main() { fmt.Println(\"hi\") }",
	}
	for _, n := range []int{minN, 1024, 5000} {
		v, err := SmallVocab(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Tokens) != n || len(v.Types) != n {
			t.Fatalf("n=%d: %d tokens, %d types", n, len(v.Tokens), len(v.Types))
		}
		if v.BOS != 0 || v.EOS != 1 {
			t.Errorf("n=%d: BOS %d EOS %d", n, v.BOS, v.EOS)
		}
		tk, err := tokenizer.New(v)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		for _, s := range texts {
			ids := tk.Encode(s)
			back, err := tk.Decode(ids)
			if err != nil || string(back) != s {
				t.Errorf("n=%d: round trip of %q gave %q (%v)", n, s, back, err)
			}
			if n >= 1024 && len(ids) >= len(s) && s == texts[0] {
				t.Errorf("n=%d: %d ids for %d bytes: merges do not apply", n, len(ids), len(s))
			}
		}
		// Special tokens of the chat protocol are single tokens.
		for _, sp := range []string{chat.BOS, chat.EOS, chat.UserToken, chat.AssistantToken,
			chat.ThinkStart, chat.ThinkEnd, chat.DSMLToken, chat.LatestReminderToken} {
			id, ok := tk.Lookup(sp)
			if !ok {
				t.Errorf("n=%d: %q missing", n, sp)
				continue
			}
			if got := tk.EncodeWithSpecial("a" + sp + "b"); !slices.Contains(got, id) {
				t.Errorf("n=%d: %q not recognised: %v", n, sp, got)
			}
		}
	}
	// A smaller vocabulary's tokens and merges are part of a larger one's.
	a, _ := SmallVocab(1024)
	b, _ := SmallVocab(2048)
	for _, list := range [][2][]string{{a.Tokens, b.Tokens}, {a.Merges, b.Merges}} {
		in := make(map[string]bool)
		for _, s := range list[1] {
			in[s] = true
		}
		for _, s := range list[0] {
			if !in[s] {
				t.Errorf("%q of the 1024-token vocabulary is not in the 2048-token one", s)
			}
		}
	}
	real, err := SmallVocab(RealVocabSize)
	if err != nil || len(real.Tokens) != RealVocabSize {
		t.Fatalf("SmallVocab(%d): %v", RealVocabSize, err)
	}
}
