// Command seatservice is an HTTP service of timed seat holds with
// conditional.Holds: a passenger holds a seat for HOLD_TTL, then confirms
// it (pays) or releases it. Every change is one conditional UPDATE judged
// by the database's clock, so a seat never has two holders, and a
// passenger whose hold ran out cannot confirm a seat another has taken
// since.
//
// Environment:
//
//	DATABASE_URL  PostgreSQL (required); the holds table is created at start
//	HOLD_TTL      how long a hold lasts (default 10m)
//	ADDR          listen address (default :8080)
//
// There is no reaper: Holds never deletes a row, and a hold past its end
// counts as free to every call, so nothing needs sweeping.
//
// Try it:
//
//	DATABASE_URL=postgres://postgres@localhost:5432/postgres go run ./examples/seatservice
//	curl -X PUT localhost:8080/seats/1A; curl -X PUT localhost:8080/seats/1B
//	curl -X POST localhost:8080/seats/1A/hold -d '{"holder": "alice"}'
//	curl -X POST localhost:8080/seats/1A/hold -d '{"holder": "bob"}'               # 409: held
//	curl -X POST localhost:8080/holds -d '{"holder": "bob", "seats": ["1A", "1B"]}' # any free one: 1B
//	curl -X POST localhost:8080/seats/1A/confirm -d '{"holder": "alice"}'
//	curl -X POST localhost:8080/seats/1B/release -d '{"holder": "bob"}'
//	curl localhost:8080/seats/1A
package main

import (
	"net/http"
	"time"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/examples/internal/pgservice"
	"github.com/nolock/nolock/examples/internal/service"
)

func main() {
	s := service.New("seatservice")
	s.Require("DATABASE_URL")
	ttl := s.Duration("HOLD_TTL", 10*time.Minute)
	pool := pgservice.Pool(s)
	holds, err := conditional.NewHolds(pool, conditional.WithObserver(s.Observer()))
	if err != nil {
		s.Fatal(err)
	}
	s.OnStop(holds.Close)
	if err := holds.CreateSchema(s.Context()); err != nil {
		s.Fatal(err)
	}
	seats := seats{holds, ttl}
	s.HandleFunc("PUT /seats/{seat}", seats.add)
	s.HandleFunc("GET /seats/{seat}", seats.get)
	s.HandleFunc("POST /seats/{seat}/hold", seats.hold)
	s.HandleFunc("POST /seats/{seat}/confirm", seats.confirm)
	s.HandleFunc("POST /seats/{seat}/release", seats.release)
	s.HandleFunc("POST /holds", seats.holdAny)
	s.Run()
}

type seats struct {
	holds *conditional.Holds
	ttl   time.Duration
}

// status is a seat's state in answers.
type status struct {
	Seat      string     `json:"seat"`
	Holder    string     `json:"holder,omitempty"`
	Until     *time.Time `json:"until,omitempty"` // on the database's clock
	Confirmed bool       `json:"confirmed,omitempty"`
}

type request struct {
	Holder string   `json:"holder"`
	Seats  []string `json:"seats,omitempty"` // POST /holds only
}

func (ss seats) add(w http.ResponseWriter, r *http.Request) {
	if err := ss.holds.Add(r.Context(), r.PathValue("seat")); err != nil {
		fail(w, err)
		return
	}
	ss.get(w, r)
}

func (ss seats) get(w http.ResponseWriter, r *http.Request) {
	st, err := ss.holds.Get(r.Context(), r.PathValue("seat"))
	if err != nil {
		fail(w, err)
		return
	}
	out := status{Seat: st.Resource, Holder: st.Holder, Confirmed: st.Confirmed}
	if !st.Until.IsZero() {
		out.Until = &st.Until
	}
	service.JSON(w, http.StatusOK, out)
}

// A holder's calls: the body names the holder (and, for POST /holds, the
// seats); each answers the seat's new state or why not.

func (ss seats) hold(w http.ResponseWriter, r *http.Request) {
	withHolder(w, r, func(req request) {
		until, err := ss.holds.Hold(r.Context(), r.PathValue("seat"), req.Holder, ss.ttl)
		answer(w, err, status{Seat: r.PathValue("seat"), Holder: req.Holder, Until: &until})
	})
}

// holdAny holds whichever of the seats is free.
func (ss seats) holdAny(w http.ResponseWriter, r *http.Request) {
	withHolder(w, r, func(req request) {
		seat, until, err := ss.holds.HoldAny(r.Context(), req.Seats, req.Holder, ss.ttl)
		answer(w, err, status{Seat: seat, Holder: req.Holder, Until: &until})
	})
}

func (ss seats) confirm(w http.ResponseWriter, r *http.Request) {
	withHolder(w, r, func(req request) {
		err := ss.holds.Confirm(r.Context(), r.PathValue("seat"), req.Holder)
		answer(w, err, status{Seat: r.PathValue("seat"), Holder: req.Holder, Confirmed: true})
	})
}

func (ss seats) release(w http.ResponseWriter, r *http.Request) {
	withHolder(w, r, func(req request) {
		answer(w, ss.holds.Release(r.Context(), r.PathValue("seat"), req.Holder), status{Seat: r.PathValue("seat")})
	})
}

// withHolder reads the request's body and calls f, unless the body is bad
// or names no holder.
func withHolder(w http.ResponseWriter, r *http.Request, f func(request)) {
	var req request
	if !service.ReadJSON(w, r, &req) {
		return
	}
	if req.Holder == "" {
		service.Error(w, http.StatusBadRequest, "holder is required")
		return
	}
	f(req)
}

// answer writes st, or the failure err says.
func answer(w http.ResponseWriter, err error, st status) {
	if err != nil {
		fail(w, err)
		return
	}
	service.JSON(w, http.StatusOK, st)
}

// fail answers with the status err means (pgservice.Status).
func fail(w http.ResponseWriter, err error) { service.Error(w, pgservice.Status(err), err.Error()) }
