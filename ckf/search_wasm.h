// The body of the prefix searches (prefixSearch, prefixSearchGroups in
// kernels_wasm.s), included once per kernel after its prologue has set R11
// (the PrefixSearch) and checked the contract; PROBE(NEED) is each kernel's
// memoized probe of position R12 (NEED pushes the lanes the search needs
// there: the one-table kernel ignores it, the multi-group one reads only
// their groups), so both run one search algorithm.
	Get R11; I32WrapI64; F64Load S_STAMP; Set F16
	Get R11; I32WrapI64; I64Load32U S_GEN; F64ReinterpretI64; Set F17
	Get R11; I32WrapI64; F64Load S_MEMO; Set F18
	Get R11; I32WrapI64; F64Load S_SEQ; Set F19
	Get R11; I32WrapI64; I64Load16U S_READY; F64ReinterpretI64; Set F20
	Get R11; I32WrapI64; F64Load S_N; Set F22
	STORES(S_PROBES, I64Const $0)
	STORES(S_RESUME, I64Const $-1)
	STORES(S_ARG, I64Const $0)
	STORES(S_SP, I64Const $0)
	STORES(S_GROUPS, I64Const $0)
	Get R11; I32WrapI64; I64Const $0; I64Store16 S_FALLBACK
	// lo[l] = -1 for every lane
	I64Const $-1; Set R6
	I64Const $0xFFFF; Set R5
	FORLANES(R5, SETLO(R6))

	// Gallop: R13 active, R14 last (-1 before position 0), R15 p. The loop
	// probes position 0 too (one inlined probe fewer, so less code to fetch
	// on each call): there every lane is active and a miss pushes no group
	// (the lane's lo stays -1).
	I64Const $-1; Set R13
	I64Const $-1; Set R14
	I64Const $0; Set R15
	Block; Loop
		Get R13; I64Eqz; BrIf $1
		Get R14; N64; I64Const $1; I64Sub; I64GeS; BrIf $1
		Get R15; N64; I64Const $1; I64Sub; I64GtS
		If; N64; I64Const $1; I64Sub; Set R15; End
		Get R15; Set R12
		PROBE(Get R13)
		Get R13; Get R9; I64Const $-1; I64Xor; I64And; Tee R10
		I64Eqz; I32Eqz; Get R14; I64Const $0; I64GeS; I32And
		If; PUSH(R10, R14, R15); End
		Get R13; Get R9; I64And; Set R13
		Get R15; Set R14
		Get R15; I64Const $1; I64Shl; Get R15; I64Eqz; I64ExtendI32U; I64Or; Set R15
		Br $0
	End; End
	Get R13; I64Eqz; I32Eqz
	If; N64; Set R10; PUSH(R13, R14, R10); End

	// Grouped binary search: R13 lanes, R14 a, R15 z of the popped group.
	Block; Loop
		LOADS(S_SP); I64Eqz; BrIf $1
		STORES(S_SP, LOADS(S_SP); I64Const $1; I64Sub)
		Get R11; I64Const S_STACK; I64Add; LOADS(S_SP); I64Const $24; I64Mul; I64Add; Set R1
		Get R1; I32WrapI64; I64Load $0; Set R13
		Get R1; I32WrapI64; I64Load $8; Set R14
		Get R1; I32WrapI64; I64Load $16; Set R15
		Block; Loop
			Get R15; Get R14; I64Sub; I64Const $1; I64LeS; BrIf $1
			Get R14; Get R15; Get R14; I64Sub; I64Const $1; I64ShrU; I64Add; Set R12
			PROBE(Get R13)
			Get R13; Get R9; I64And; Set R5
			Get R13; Get R9; I64Const $-1; I64Xor; I64And; Set R6
			Get R6; I64Eqz
			If
				Get R12; Set R14
			Else
				Get R5; I64Eqz
				If
					Get R12; Set R15
				Else
					PUSH(R6, R14, R12)
					Get R5; Set R13
					Get R12; Set R14
				End
			End
			Br $0
		End; End
		STORES(S_ARG, Get R13)
		STORES(S_T, Get R14; I64Const $1; I64Add)
		Get R13; Set R5
		FORLANES(R5, SETLO(R14))
		STORES(S_GROUPS, LOADS(S_GROUPS); I64Const $1; I64Add)
		Br $0
	End; End

	LOADS(S_GROUPS); I64Const $1; I64Eq
	If
		// Shared window: R13 pending lanes, R14 t, R15 left, R12 p.
		LOADS(S_ARG); Set R13
		STORES(S_ARG, I64Const $0)
		LOADS(S_T); Set R14
		Get R14; LOADS(S_WINDOW); I64Sub; Tee R15
		I64Const $0; I64LtS
		If; I64Const $0; Set R15; End
		STORES(S_LEFT, Get R15)
		Get R15; Set R12
		Block; Loop
			Get R12; Get R14; I64GeS; BrIf $1
			Get R13; I64Eqz; BrIf $1
			PROBE(Get R13)
			// R5: lanes missing at p; a miss at the window's left edge
			// (left > 0) goes to the caller's fallback, any other is the depth.
			Get R13; Get R9; I64Const $-1; I64Xor; I64And; Set R5
			Get R12; Get R15; I64Eq; Get R15; I64Const $0; I64GtS; I32And
			If
				STORES(S_ARG, LOADS(S_ARG); Get R5; I64Or)
			Else
				FORLANES(R5, SETDEPTH(Get R12))
			End
			Get R13; Get R9; I64And; Set R13
			Get R12; I64Const $1; I64Add; Set R12
			Br $0
		End; End
		FORLANES(R13, SETDEPTH(Get R14))
		Get R11; I32WrapI64; LOADS(S_ARG); I64Store16 S_FALLBACK
		RET
	End

	// Lane by lane: R13 lanes left, R14 lane, R15 t, R12 p; left in S_LEFT.
	Get R11; I32WrapI64; I64Load16U S_READY; Set R13
	Block; Loop
		Get R13; I64Eqz; BrIf $1
		Get R13; I64Ctz; Set R14
		Get R11; I32WrapI64; Get R14; I32WrapI64; I32Const $3; I32Shl; I32Add; I64Load S_LO; I64Const $1; I64Add; Set R15
		Get R14; Set R1
		Get R15; I64Eqz
		If
			SETDEPTH(I64Const $0)
		Else
			Get R15; LOADS(S_WINDOW); I64Sub; Tee R12
			I64Const $0; I64LtS
			If; I64Const $0; Set R12; End
			STORES(S_LEFT, Get R12)
			Block; Loop
				Get R12; Get R15; I64GeS; BrIf $1
				PROBE(I64Const $1; Get R14; I64Shl)
				Get R9; Get R14; I64ShrU; I64Const $1; I64And; I64Eqz; BrIf $1
				Get R12; I64Const $1; I64Add; Set R12
				Br $0
			End; End
			Get R14; Set R1
			Get R12; Get R15; I64Eq
			If
				SETDEPTH(Get R15)
			Else
				Get R12; LOADS(S_LEFT); I64Eq; Get R12; I64Const $0; I64GtS; I32And
				If
					STORES(S_RESUME, Get R14)
					RET
				End
				SETDEPTH(Get R12)
			End
		End
		Get R13; Get R13; I64Const $1; I64Sub; I64And; Set R13
		Br $0
	End; End
	RET
