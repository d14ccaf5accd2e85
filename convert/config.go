package convert

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"ds4go/model"
)

// hfConfig is the part of a Hugging Face DeepSeek V4 config.json that the
// conversion reads. Pointers distinguish absent keys from zero values.
type hfConfig struct {
	ModelType      *string  `json:"model_type"`
	Architectures  []string `json:"architectures"`
	HiddenSize     *int     `json:"hidden_size"`
	Layers         *int     `json:"num_hidden_layers"`
	Vocab          *int     `json:"vocab_size"`
	MaxPositions   *int     `json:"max_position_embeddings"`
	Heads          *int     `json:"num_attention_heads"`
	KVHeads        *int     `json:"num_key_value_heads"`
	HeadDim        *int     `json:"head_dim"`
	RopeDim        *int     `json:"qk_rope_head_dim"`
	QLoraRank      *int     `json:"q_lora_rank"`
	OLoraRank      *int     `json:"o_lora_rank"`
	OGroups        *int     `json:"o_groups"`
	SlidingWindow  *int     `json:"sliding_window"`
	Experts        *int     `json:"n_routed_experts"`
	ExpertsUsed    *int     `json:"num_experts_per_tok"`
	ExpertFF       *int     `json:"moe_intermediate_size"`
	SharedExperts  *int     `json:"n_shared_experts"`
	HashLayers     *int     `json:"num_hash_layers"`
	NGroup         *int     `json:"n_group"`
	TopKGroup      *int     `json:"topk_group"`
	CompressRatios []int    `json:"compress_ratios"`
	IndexHeads     *int     `json:"index_n_heads"`
	IndexHeadDim   *int     `json:"index_head_dim"`
	IndexTopK      *int     `json:"index_topk"`
	HCMult         *int     `json:"hc_mult"`
	HCSinkhorn     *int     `json:"hc_sinkhorn_iters"`
	HCEps          *float64 `json:"hc_eps"`
	RMSNormEps     *float64 `json:"rms_norm_eps"`
	RopeTheta      *float64 `json:"rope_theta"`
	CompressTheta  *float64 `json:"compress_rope_theta"`
	RopeScaling    *struct {
		Type         *string  `json:"type"`
		RopeType     *string  `json:"rope_type"`
		Factor       *float64 `json:"factor"`
		BetaFast     *float64 `json:"beta_fast"`
		BetaSlow     *float64 `json:"beta_slow"`
		OrigMaxPos   *int     `json:"original_max_position_embeddings"`
		MScale       *float64 `json:"mscale"`
		MScaleAllDim *float64 `json:"mscale_all_dim"`
	} `json:"rope_scaling"`
	RoutedScale  *float64       `json:"routed_scaling_factor"`
	NormTopK     *bool          `json:"norm_topk_prob"`
	ScoringFunc  *string        `json:"scoring_func"`
	SwigluLimit  *float64       `json:"swiglu_limit"`
	HiddenAct    *string        `json:"hidden_act"`
	AttnBias     *bool          `json:"attention_bias"`
	TieEmbedding *bool          `json:"tie_word_embeddings"`
	QuantConfig  *hfQuantConfig `json:"quantization_config"`
}

// hfQuantConfig is config.json's quantization_config of the FP8 release.
type hfQuantConfig struct {
	QuantMethod     string `json:"quant_method"`
	Fmt             string `json:"fmt"`
	ScaleFmt        string `json:"scale_fmt"`
	WeightBlockSize []int  `json:"weight_block_size"`
}

// ConfigError lists everything in a config.json that cannot be converted.
type ConfigError struct {
	Problems []string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("config.json: %d problem(s):\n  %s", len(e.Problems), strings.Join(e.Problems, "\n  "))
}

// ParseConfig maps a Hugging Face DeepSeek V4 config.json to model.Config
// and validates the result (model.Config.Validate). It rejects what the
// engine cannot represent: another scoring function, more than one KV head,
// grouped routing, tied embeddings, attention biases, a non-SiLU activation.
func ParseConfig(data []byte) (model.Config, error) {
	var c model.Config
	var hf hfConfig
	if err := json.Unmarshal(data, &hf); err != nil {
		return c, fmt.Errorf("config.json: %w", err)
	}
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	req := func(key string, p *int, dst *int) {
		if p == nil {
			bad("%s: missing", key)
			return
		}
		*dst = *p
	}
	opt := func(p *int, dst *int, def int) {
		if p == nil {
			*dst = def
		} else {
			*dst = *p
		}
	}
	reqF := func(key string, p *float64, dst *float32) {
		if p == nil {
			bad("%s: missing", key)
			return
		}
		if math.IsNaN(*p) || math.IsInf(*p, 0) || math.Abs(*p) > math.MaxFloat32 {
			bad("%s = %v: not a finite float32", key, *p)
			return
		}
		*dst = float32(*p)
	}

	if hf.ModelType != nil && *hf.ModelType != "deepseek_v4" {
		bad("model_type %q: only deepseek_v4 converts", *hf.ModelType)
	}
	req("hidden_size", hf.HiddenSize, &c.Embed)
	req("num_hidden_layers", hf.Layers, &c.Layers)
	req("vocab_size", hf.Vocab, &c.Vocab)
	opt(hf.MaxPositions, &c.ContextLen, 0)
	req("num_attention_heads", hf.Heads, &c.Heads)
	opt(hf.KVHeads, &c.HeadsKV, 1)
	if c.HeadsKV != 1 {
		bad("num_key_value_heads = %d: DS4 attention has exactly one shared KV head", c.HeadsKV)
	}
	req("head_dim", hf.HeadDim, &c.HeadDim)
	req("qk_rope_head_dim", hf.RopeDim, &c.RopeDim)
	req("q_lora_rank", hf.QLoraRank, &c.QLoraRank)
	req("o_lora_rank", hf.OLoraRank, &c.OLoraRank)
	req("o_groups", hf.OGroups, &c.OGroups)
	req("sliding_window", hf.SlidingWindow, &c.Window)
	req("n_routed_experts", hf.Experts, &c.Experts)
	req("num_experts_per_tok", hf.ExpertsUsed, &c.ExpertsUsed)
	req("moe_intermediate_size", hf.ExpertFF, &c.ExpertFF)
	opt(hf.SharedExperts, &c.SharedExperts, 1)
	opt(hf.HashLayers, &c.HashLayers, 0)
	if (hf.NGroup != nil && *hf.NGroup > 1) || (hf.TopKGroup != nil && *hf.TopKGroup > 1) {
		bad("n_group/topk_group > 1: grouped expert routing is not part of DS4")
	}
	req("index_n_heads", hf.IndexHeads, &c.IndexerHeads)
	req("index_head_dim", hf.IndexHeadDim, &c.IndexerHeadDim)
	req("index_topk", hf.IndexTopK, &c.IndexerTopK)
	req("hc_mult", hf.HCMult, &c.HC)
	req("hc_sinkhorn_iters", hf.HCSinkhorn, &c.SinkhornIters)
	reqF("hc_eps", hf.HCEps, &c.HCEps)
	reqF("rms_norm_eps", hf.RMSNormEps, &c.NormEps)
	reqF("rope_theta", hf.RopeTheta, &c.RopeBase)
	reqF("compress_rope_theta", hf.CompressTheta, &c.CompressRopeBase)
	if rs := hf.RopeScaling; rs == nil {
		// No YaRN: a factor of 1 makes the engine's YaRN interpolation the
		// identity, which is what model.py does with original_seq_len = 0.
		c.RopeScale, c.YarnBetaFast, c.YarnBetaSlow = 1, 32, 1
		c.RopeOrigCtx = max(c.ContextLen, 1)
	} else {
		for _, t := range []*string{rs.Type, rs.RopeType} {
			if t != nil && *t != "yarn" {
				bad("rope_scaling type %q: only yarn is supported", *t)
			}
		}
		reqF("rope_scaling.factor", rs.Factor, &c.RopeScale)
		reqF("rope_scaling.beta_fast", rs.BetaFast, &c.YarnBetaFast)
		reqF("rope_scaling.beta_slow", rs.BetaSlow, &c.YarnBetaSlow)
		req("rope_scaling.original_max_position_embeddings", rs.OrigMaxPos, &c.RopeOrigCtx)
		// model.py applies no attention (mscale) factor; a config asking
		// for one describes another model.
		for _, m := range []struct {
			key string
			v   *float64
		}{{"mscale", rs.MScale}, {"mscale_all_dim", rs.MScaleAllDim}} {
			if m.v != nil && *m.v != 0 && *m.v != 1 {
				bad("rope_scaling.%s = %v: YaRN attention scaling is not part of DS4", m.key, *m.v)
			}
		}
	}
	reqF("routed_scaling_factor", hf.RoutedScale, &c.ExpertWeightsScale)
	if hf.ScoringFunc != nil && *hf.ScoringFunc != "sqrtsoftplus" {
		bad("scoring_func %q: DS4 routes with sqrtsoftplus only", *hf.ScoringFunc)
	}
	// With sqrtsoftplus the official model.py always renormalises the routed
	// weights (it only skips that for softmax), whatever norm_topk_prob says.
	c.ExpertWeightsNorm = true
	if hf.NormTopK != nil && !*hf.NormTopK {
		bad("norm_topk_prob = false: the official model renormalises sqrtsoftplus routing weights regardless; refusing an ambiguous config")
	}
	if hf.HiddenAct != nil && *hf.HiddenAct != "silu" {
		bad("hidden_act %q: DS4 experts use SiLU", *hf.HiddenAct)
	}
	if hf.AttnBias != nil && *hf.AttnBias {
		bad("attention_bias = true: DS4 projections have no bias")
	}
	if hf.TieEmbedding != nil && *hf.TieEmbedding {
		bad("tie_word_embeddings = true: DS4 has a separate output head")
	}
	if hf.CompressRatios == nil {
		bad("compress_ratios: missing")
	} else {
		// Keep the whole list, MTP entries included, as the published
		// GGUF does (44 entries for 43 layers + 1 MTP layer).
		c.CompressRatios = append([]int(nil), hf.CompressRatios...)
	}
	var limit float32
	if hf.SwigluLimit != nil {
		reqF("swiglu_limit", hf.SwigluLimit, &limit)
	}
	if c.Layers > 0 && c.Layers <= 1<<16 {
		c.SwigluClamp = make([]float32, c.Layers)
		for i := range c.SwigluClamp {
			c.SwigluClamp[i] = limit
		}
	}
	if q := hf.QuantConfig; q != nil {
		if _, _, err := q.blocks(); err != nil {
			bad("quantization_config: %v", err)
		}
	}
	if len(errs) > 0 {
		return c, &ConfigError{Problems: errs}
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("config.json: %w", err)
	}
	return c, nil
}

// blocks returns the FP8 weight block (rows, cols) the quantization_config
// declares, checking that it is the e4m3 FP8 format this package decodes.
func (q *hfQuantConfig) blocks() (int, int, error) {
	if q.QuantMethod != "" && q.QuantMethod != "fp8" {
		return 0, 0, fmt.Errorf("quant_method %q: only fp8 is supported", q.QuantMethod)
	}
	if q.Fmt != "" && q.Fmt != "e4m3" {
		return 0, 0, fmt.Errorf("fmt %q: only e4m3 is supported", q.Fmt)
	}
	if q.ScaleFmt != "" && q.ScaleFmt != "ue8m0" {
		return 0, 0, fmt.Errorf("scale_fmt %q: only ue8m0 is supported", q.ScaleFmt)
	}
	if q.WeightBlockSize == nil {
		return 128, 128, nil
	}
	if len(q.WeightBlockSize) != 2 || q.WeightBlockSize[0] <= 0 || q.WeightBlockSize[1] <= 0 ||
		q.WeightBlockSize[0] > 1<<16 || q.WeightBlockSize[1] > 1<<16 {
		return 0, 0, errors.New("weight_block_size must be two positive sizes")
	}
	return q.WeightBlockSize[0], q.WeightBlockSize[1], nil
}
