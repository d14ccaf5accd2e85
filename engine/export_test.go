package engine

// SetDraftOverride makes s's drafts f(position, the block's draft) (tests
// of the accepting path: random weights make drafts the model rejects).
func SetDraftOverride(s *Session, f func(pos int, draft int32) int32) { s.mtp.override = f }

// DraftLogits returns the MTP block's logits of s's latest draft.
func DraftLogits(s *Session) []float32 { return s.mtp.logits }
