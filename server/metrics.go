package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the server's Prometheus metrics, on a registry of its own
// (several servers can live in one process, as in tests).
type metrics struct {
	reg *prometheus.Registry

	requests         *prometheus.CounterVec
	promptTokens     prometheus.Counter
	prefilledTokens  prometheus.Counter
	cachedTokens     prometheus.Counter
	completionTokens prometheus.Counter
	cache            *prometheus.CounterVec
	toolReplay       *prometheus.CounterVec
	finish           *prometheus.CounterVec
	queueDepth       prometheus.Gauge
	active           prometheus.Gauge
	liveTokens       prometheus.Gauge
	decodeTPS        prometheus.Gauge
	prefillTPS       prometheus.Gauge
	ttft             prometheus.Histogram
	duration         *prometheus.HistogramVec
	cancelled        prometheus.Counter
	panics           prometheus.Counter
	dsmlErrors       prometheus.Counter
	kvDisk           *prometheus.CounterVec
	kvDiskBytes      prometheus.Gauge
}

func newMetrics() *metrics {
	reg := prometheus.NewRegistry()
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &metrics{reg: reg}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ds4_http_requests_total", Help: "HTTP requests by endpoint and status code.",
	}, []string{"endpoint", "code"})
	m.promptTokens = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ds4_prompt_tokens_total", Help: "Prompt tokens of generations (cached and prefilled).",
	})
	m.prefilledTokens = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ds4_prefill_tokens_total", Help: "Prompt tokens actually prefilled (not reused from the live session).",
	})
	m.cachedTokens = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ds4_cached_prompt_tokens_total", Help: "Prompt tokens reused from the live session.",
	})
	m.completionTokens = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ds4_completion_tokens_total", Help: "Generated tokens.",
	})
	m.cache = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ds4_prefix_cache_total", Help: "Live-session prefix reuse per generation: token, text, live-tail (hits) or none (miss).",
	}, []string{"source"})
	m.toolReplay = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ds4_tool_replay_total", Help: "Assistant tool-call turns rendered from the exact sampled DSML or canonically.",
	}, []string{"kind"})
	m.finish = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ds4_generations_total", Help: "Finished generations by finish reason.",
	}, []string{"finish"})
	m.queueDepth = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ds4_queue_depth", Help: "Requests waiting for the engine.",
	})
	m.active = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ds4_active_generations", Help: "Generations running on the engine.",
	})
	m.liveTokens = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ds4_live_session_tokens", Help: "Tokens held by the live session.",
	})
	m.decodeTPS = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ds4_decode_tokens_per_second", Help: "Decode speed of the last generation.",
	})
	m.prefillTPS = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ds4_prefill_tokens_per_second", Help: "Prefill speed of the last prefill of more than one token.",
	})
	m.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ds4_time_to_first_token_seconds", Help: "From queueing to the first sampled token.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
	})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "ds4_request_duration_seconds", Help: "Generation request duration by endpoint.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
	}, []string{"endpoint"})
	m.cancelled = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ds4_cancelled_generations_total", Help: "Generations stopped because the client went away.",
	})
	m.panics = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ds4_recovered_panics_total", Help: "Panics recovered in handlers or the engine worker.",
	})
	m.dsmlErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ds4_dsml_errors_total", Help: "Malformed DSML tool calls returned as text.",
	})
	m.kvDisk = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ds4_kv_disk_total", Help: "Disk KV cache events: hit, miss, corrupt, rejected, save_cold/continued/evict/shutdown, save_error.",
	}, []string{"event"})
	m.kvDiskBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ds4_kv_disk_bytes", Help: "Bytes of disk KV cache files after the last save.",
	})
	for _, c := range []prometheus.Collector{m.kvDisk, m.kvDiskBytes, m.requests, m.promptTokens, m.prefilledTokens, m.cachedTokens,
		m.completionTokens, m.cache, m.toolReplay, m.finish, m.queueDepth, m.active, m.liveTokens,
		m.decodeTPS, m.prefillTPS, m.ttft, m.duration, m.cancelled, m.panics, m.dsmlErrors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		f(c)
	}
	return m
}
