package tokenizer

import "fmt"

// addedMatcher finds added tokens in text: a byte trie over their strings.
type addedMatcher struct {
	first [256]bool        // bytes that start some added token
	edges map[uint64]int32 // node<<8 | byte -> child node; the root is node 0
	term  []int32          // per node: the token that ends there, or -1
}

func (m *addedMatcher) build(tokens []string, types []int32) error {
	m.edges = make(map[uint64]int32)
	m.term = []int32{-1}
	for id, tok := range tokens {
		if types[id] != TypeControl && types[id] != TypeUserDefined {
			continue
		}
		if tok == "" {
			return fmt.Errorf("tokenizer: added token %d is empty", id)
		}
		m.first[tok[0]] = true
		node := int32(0)
		for i := 0; i < len(tok); i++ {
			k := uint64(node)<<8 | uint64(tok[i])
			child, ok := m.edges[k]
			if !ok {
				child = int32(len(m.term))
				m.term = append(m.term, -1)
				m.edges[k] = child
			}
			node = child
		}
		m.term[node] = int32(id) // token strings are unique (New checks)
	}
	return nil
}

// longestAt returns the longest added token that starts at s[i] and the end
// of its match, or end -1 if none does.
func (m *addedMatcher) longestAt(s string, i int) (id int32, end int) {
	id, end = -1, -1
	node := int32(0)
	for j := i; j < len(s); j++ {
		child, ok := m.edges[uint64(node)<<8|uint64(s[j])]
		if !ok {
			break
		}
		node = child
		if t := m.term[node]; t >= 0 {
			id, end = t, j+1
		}
	}
	return id, end
}
