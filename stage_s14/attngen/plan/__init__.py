"""Target-neutral planning: profiles, the mask and schedule rules, the KernelPlan, the checker
and the lowering driver. Knows the language (attngen.lang), never a backend: the backend that
checks, configures and lowers a spec is handed in (attngen.plan.lower.lower)."""
