package synth

import (
	"fmt"

	"ds4go/gguf"
	"ds4go/model"
)

// BuildFile builds a model in memory (Build) and parses it, ready for
// model.Load.
func BuildFile(opts Options) (*gguf.File, error) {
	data, err := Build(opts)
	if err != nil {
		return nil, err
	}
	f, err := gguf.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("synth: parsing the built model: %w", err)
	}
	return f, nil
}

// DemoConfig is the demo model's shape: Tiny with the real DeepSeek V4
// vocabulary, so the demo runs the real tokenizer.
func DemoConfig() model.Config {
	c := Tiny()
	c.Vocab = RealVocabSize
	return c
}

// Demo builds the built-in demo model that ds4, ds4-server and ds4-bench run
// when no GGUF is given: DemoConfig in the q8 scheme with seed 1 (about 0.6 s
// on two cores). It runs the real forward pass and the real tokenizer, but
// its weights are random, so its text is meaningless.
func Demo() (*gguf.File, error) {
	return BuildFile(Options{Config: DemoConfig(), Scheme: model.SchemeQ8, Seed: 1})
}
