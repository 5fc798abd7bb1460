package otlp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Protocols of OTEL_EXPORTER_OTLP_PROTOCOL.
const (
	protocolHTTP = "http/protobuf"
	protocolGRPC = "grpc"
)

// Enabled reports whether the environment names an OTLP endpoint: whether
// OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set and not empty. Programs that
// export only when asked to call Setup only if it is true.
func Enabled() bool {
	for _, k := range []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
	} {
		if strings.TrimSpace(os.Getenv(k)) != "" {
			return true
		}
	}
	return false
}

// Setup creates an SDK tracer provider with a batch span processor and an
// OTLP trace exporter, and an SDK meter provider with a periodic reader and
// an OTLP metric exporter, and installs them as the global providers
// (otel.SetTracerProvider, otel.SetMeterProvider), together with the W3C
// trace-context and baggage propagator (otel.SetTextMapPropagator). Both
// are configured from the OTEL_* environment variables only (see the
// package doc). The resource's service.name is serviceName unless
// OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) is set;
// it also carries host.name, process.pid and the SDK's name and version.
//
// Setup does no I/O: the exporters connect when they first export. It
// returns an error, and installs nothing, when a variable has a value it
// does not support (naming the variable and the value) or the resource
// cannot be built. With OTEL_SDK_DISABLED=true it installs nothing and
// returns a shutdown that does nothing.
//
// shutdown flushes the spans and metrics not yet exported and stops the
// providers; call it once, after everything that records has stopped, with
// a context that bounds how long it may take (the providers are unusable
// afterwards; the globals keep pointing at them). It returns the errors of
// that last export, if any. Setup is meant to be called once per process;
// calling it again replaces the globals, and the previous shutdown still
// stops the previous providers.
func Setup(ctx context.Context, serviceName string) (shutdown func(context.Context) error, err error) {
	nop := func(context.Context) error { return nil }
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return nop, nil
	}
	tracesOn, err := exporterEnabled("OTEL_TRACES_EXPORTER")
	if err != nil {
		return nil, err
	}
	metricsOn, err := exporterEnabled("OTEL_METRICS_EXPORTER")
	if err != nil {
		return nil, err
	}
	tracesProto, err := protocol("TRACES")
	if err != nil {
		return nil, err
	}
	metricsProto, err := protocol("METRICS")
	if err != nil {
		return nil, err
	}

	res, err := resource.New(ctx,
		// Later options win: the environment overrides serviceName.
		resource.WithAttributes(semconv.ServiceName(serviceName)),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("otlp: reading the resource attributes: %w", err)
	}

	var stops []func(context.Context) error
	shutdown = func(ctx context.Context) error {
		var errs []error
		for _, stop := range stops {
			errs = append(errs, stop(ctx))
		}
		return errors.Join(errs...)
	}
	var tp *sdktrace.TracerProvider
	if tracesOn {
		if tp, err = tracerProvider(ctx, tracesProto, res); err != nil {
			return nil, err
		}
		stops = append(stops, tp.Shutdown)
	}
	var mp *sdkmetric.MeterProvider
	if metricsOn {
		if mp, err = meterProvider(ctx, metricsProto, res); err != nil {
			_ = shutdown(ctx)
			return nil, err
		}
		stops = append(stops, mp.Shutdown)
	}

	if tp != nil {
		otel.SetTracerProvider(tp)
	}
	if mp != nil {
		otel.SetMeterProvider(mp)
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return shutdown, nil
}

// tracerProvider returns a tracer provider that exports over proto.
// NewTracerProvider reads OTEL_TRACES_SAMPLER and the span limits,
// NewBatchSpanProcessor the OTEL_BSP_* variables.
func tracerProvider(ctx context.Context, proto string, res *resource.Resource) (*sdktrace.TracerProvider, error) {
	var exp sdktrace.SpanExporter
	var err error
	if proto == protocolGRPC {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("otlp: creating the %s trace exporter: %w", proto, err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(exp)), nil
}

// meterProvider returns a meter provider that exports over proto.
// NewPeriodicReader reads OTEL_METRIC_EXPORT_INTERVAL and _TIMEOUT. The
// instruments carry their own bucket boundaries (tracing.DurationBuckets),
// so no view is needed.
func meterProvider(ctx context.Context, proto string, res *resource.Resource) (*sdkmetric.MeterProvider, error) {
	var exp sdkmetric.Exporter
	var err error
	if proto == protocolGRPC {
		exp, err = otlpmetricgrpc.New(ctx)
	} else {
		exp, err = otlpmetrichttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("otlp: creating the %s metric exporter: %w", proto, err)
	}
	return sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp))), nil
}

// exporterEnabled reads OTEL_TRACES_EXPORTER or OTEL_METRICS_EXPORTER:
// "otlp" (or unset) gives true, "none" false; other exporters (console,
// prometheus, zipkin, several at once) are not supported here.
func exporterEnabled(key string) (bool, error) {
	switch v := strings.ToLower(strings.TrimSpace(os.Getenv(key))); v {
	case "", "otlp":
		return true, nil
	case "none":
		return false, nil
	default:
		return false, fmt.Errorf("otlp: %s=%q is not supported: use otlp or none", key, os.Getenv(key))
	}
}

// protocol returns the OTLP protocol of signal (TRACES or METRICS): the
// signal's OTEL_EXPORTER_OTLP_<signal>_PROTOCOL, else
// OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf.
func protocol(signal string) (string, error) {
	for _, key := range []string{"OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		switch v := strings.TrimSpace(os.Getenv(key)); v {
		case "":
			continue
		case protocolHTTP, protocolGRPC:
			return v, nil
		default:
			return "", fmt.Errorf("otlp: %s=%q is not supported: use %s or %s", key, v, protocolHTTP, protocolGRPC)
		}
	}
	return protocolHTTP, nil
}
