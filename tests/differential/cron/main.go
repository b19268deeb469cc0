// crondiff answers schedule questions with the real github.com/robfig/cron/v3, parsing exactly
// as kube-controller-manager's cronjob controller does (formatSchedule, then ParseStandard with
// panic recovery). Input and output are the JSON lines of `pilothouse schedule --batch`.
// Used only by Pilothouse's differential test; never shipped.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

type query struct {
	Schedule string  `json:"schedule"`
	TimeZone *string `json:"timeZone"`
	From     string  `json:"from"`
}

type answer struct {
	Valid bool     `json:"valid"`
	Error *string  `json:"error"`
	Next  []string `json:"next"`
}

func parse(q query) (sched cron.Schedule, loc *time.Location, err error) {
	spec := q.Schedule
	loc = time.Local
	if q.TimeZone != nil {
		l, e := time.LoadLocation(*q.TimeZone)
		if e != nil {
			return nil, nil, fmt.Errorf("invalid timeZone: %q: %s", *q.TimeZone, e)
		}
		loc = l
		if !strings.Contains(spec, "TZ") {
			spec = fmt.Sprintf("TZ=%s %s", *q.TimeZone, spec)
		}
	}
	defer func() {
		if r := recover(); r != nil {
			sched = nil
			err = fmt.Errorf("invalid schedule format: %v", r)
		}
	}()
	sched, err = cron.ParseStandard(spec)
	if s, ok := sched.(*cron.SpecSchedule); ok {
		loc = s.Location
	}
	return
}

func main() {
	count := flag.Int("count", 5, "run times per answer")
	flag.Parse()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		var q query
		a := answer{Next: []string{}}
		if err := json.Unmarshal(in.Bytes(), &q); err != nil {
			msg := "input line: " + err.Error()
			a.Error = &msg
			_ = enc.Encode(a)
			continue
		}
		from, err := time.Parse(time.RFC3339Nano, q.From)
		if err != nil {
			msg := "from: " + err.Error()
			a.Error = &msg
			_ = enc.Encode(a)
			continue
		}
		sched, loc, err := parse(q)
		if err != nil {
			msg := err.Error()
			a.Error = &msg
			_ = enc.Encode(a)
			continue
		}
		a.Valid = true
		// As the controller: times arrive in the process's local zone.
		t := from.In(time.Local)
		for i := 0; i < *count; i++ {
			t = sched.Next(t)
			if t.IsZero() {
				break
			}
			a.Next = append(a.Next, t.In(loc).Format(time.RFC3339))
		}
		_ = enc.Encode(a)
	}
}
