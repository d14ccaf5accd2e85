package main

import "math"

func mathLog(x float64) float64 { return math.Log(x) }

// jsonSafe replaces non-finite floats (which encoding/json rejects) in the
// report with 0 where they can occur: a perplexity error over fewer than
// two tokens.
func jsonSafe(r report) report {
	if p := r.Perplexity; p != nil {
		q := *p
		for _, v := range []*float64{&q.PPL, &q.StdErr, &q.MeanNLL} {
			if math.IsNaN(*v) || math.IsInf(*v, 0) {
				*v = 0
			}
		}
		r.Perplexity = &q
	}
	if s := r.Compare; s != nil {
		c := *s
		for _, v := range []*float64{&c.RelErrP50, &c.RelErrP95, &c.RelErrMax} {
			if math.IsInf(*v, 0) {
				*v = math.MaxFloat64
			}
		}
		r.Compare = &c
	}
	return r
}
