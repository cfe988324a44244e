//! The tuning database: schedules that `smallgemm tune` measured to be fastest, per machine
//! (CPU model and ISA) and shape. The JIT uses them when present and the planner otherwise.
//!
//! It is a JSON file at `$SMALLGEMM_TUNING_DB` if set, else
//! `$XDG_CONFIG_HOME/smallgemm/tuning.json`, else `~/.config/smallgemm/tuning.json`:
//!
//! ```json
//! { "version": 1,
//!   "cpu": { "Intel(R) Xeon(R) Processor (family 6 model 207) | avx512":
//!              { "f64 16x16x16 nn": { "m_vectors": 2, ... } } },
//!   "gpu": { ... } }
//! ```
//!
//! A machine is keyed by CPU model name, family and model numbers and ISA
//! ([`machine_key`]); lookups fall back to entries under the model name and ISA alone
//! ([`model_key`]), the form of databases written before the numbers were part of the key.
//!
//! The library also ships a database of its own ([`shipped`]): what `smallgemm tune` found on
//! the machines smallgemm was developed on. It fills in the shapes the user's database does
//! not have, for those machines only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use smallgemm_ir::{GemmSpec, Isa, Schedule, Trans};

use crate::Error;

/// The file format's version; a file of another version is not read.
pub const VERSION: u32 = 1;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TuningDb {
    pub version: u32,
    /// Machine key ([`machine_key`]) → shape key ([`shape_key`]) → schedule.
    #[serde(default)]
    pub cpu: BTreeMap<String, BTreeMap<String, Schedule>>,
    /// GPU entries (`smallgemm tune --gpu`), kept as they are.
    #[serde(default)]
    pub gpu: serde_json::Map<String, serde_json::Value>,
}

/// Where the database lives (see the module documentation).
pub fn default_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SMALLGEMM_TUNING_DB") {
        return Some(PathBuf::from(p));
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(config.join("smallgemm").join("tuning.json"))
}

/// The tuning database built into the library: `smallgemm tune --dtype both --sizes 2..32
/// --candidates 32 --reps 31`, and the same with `--sizes none --small-k`, on the
/// development machines (see `jit-runtime/tuning/`): an Intel Xeon (every shape, under its
/// model name: Sapphire Rapids, reported as "Intel(R) Xeon(R) Processor"), an Emerald
/// Rapids Xeon reporting the same name (family 6 model 207: thirteen squares and twelve
/// small-k shapes re-tuned where three alternated `smallgemm bench` runs confirmed the new
/// winner over the Sapphire Rapids entry, docs/perf-notes.md, twenty-first session; f32
/// 18x18x18, f32 32x32x8 and f64 16x16x8 in the twenty-second; f64 2x2x2, 3x3x3, 5x5x5,
/// 6x6x6 and 12x12x12 and f32 2x2x2, 4x4x4, 6x6x6 and 7x7x7 in the twenty-third; f64
/// 17x17x17 and 31x31x31 and f32 23x23x23 in the twenty-fourth; the rest falls back to
/// those), an Ice Lake Xeon (`Intel(R) Xeon(R) Processor @ 2.80GHz`, family 6 model 106:
/// fourteen f64 and six f32 squares and seven small-k shapes whose tuned schedules ran
/// faster than the planner's in alternated `smallgemm bench` runs (in every run or, at
/// six of them, on average), docs/perf-notes.md, thirty-eighth session; the planner
/// serves the rest there, since its model name differs from the others'), and an AMD
/// EPYC (Zen 4) where only the winners that `smallgemm bench` confirmed against the
/// planner in three alternated runs were kept: f64 3x3x3 and 4x4x4 (docs/perf-notes.md,
/// ninth session), and f64 and f32 4x4x8, 4x4x16 and 4x4x32 (tenth session), and an AMD
/// EPYC without AVX-512 (Zen 3, family 25 model 1: fifteen squares and eight small-k shapes
/// whose tuned schedules beat the planner's in two or three sets of alternated `smallgemm
/// bench` runs, docs/perf-notes.md, thirty-ninth session; f32 6x6x6, 7x7x7 and 12x12x12 in
/// the fortieth, tuned with the hot batch at half of L2). Its `gpu`
/// section holds an H200's squares, and the f64 buckets of its variable-size batches,
/// where they beat the planner's H100 defaults in the bench (docs/gpu-notes.md, versions
/// 27 to 30), and an H100's: those of the H200's entries, and f16 entries tuned there, that
/// beat the planner on the H100 in all of three alternated bench runs (version 37); `Gpu`
/// reads them beneath the user's entries.
pub fn shipped() -> &'static TuningDb {
    static SHIPPED: std::sync::OnceLock<TuningDb> = std::sync::OnceLock::new();
    SHIPPED.get_or_init(|| {
        // A test checks that both parse; should one not, the planner serves its shapes.
        let cpu: TuningDb = serde_json::from_str(SHIPPED_CPU_JSON).unwrap_or_default();
        let gpu: TuningDb = serde_json::from_str(SHIPPED_GPU_JSON).unwrap_or_default();
        TuningDb {
            gpu: gpu.gpu,
            ..cpu
        }
    })
}

/// [`shipped`]'s CPU entries, in a file of their own so that a `Jit` reads no GPU entries
/// (scanning past them cost a process's first `Jit::new` about 110 µs on a Zen 3: 359 µs
/// median with one file, 248 µs with two).
const SHIPPED_CPU_JSON: &str = include_str!("../tuning/shipped-cpu.json");

/// [`shipped`]'s GPU entries.
const SHIPPED_GPU_JSON: &str = include_str!("../tuning/shipped-gpu.json");

/// The shipped database's CPU entries for this CPU (its [`machine_key`] and [`model_key`]
/// with each ISA), parsed once and shared by every `Jit` without a database of its own
/// (copying it cost a new `Jit` about 10 µs). Not all of it: parsing every entry, the GPU
/// ones as JSON values most of all, took 1.0-2.3 ms on a Zen 3, and a process's first
/// `Jit::new` 1.9 ms (median; 0.54 ms with only this CPU's entries parsed).
pub(crate) fn shipped_for_this_cpu() -> &'static Arc<TuningDb> {
    static SHIPPED: std::sync::OnceLock<Arc<TuningDb>> = std::sync::OnceLock::new();
    SHIPPED.get_or_init(|| {
        let machines: Vec<String> = [Isa::Avx2, Isa::Avx512, Isa::Neon]
            .into_iter()
            .flat_map(|isa| [machine_key(isa), model_key(isa)])
            .collect();
        // A test checks that it parses; should it not, the planner serves every shape.
        Arc::new(cpu_entries_of(SHIPPED_CPU_JSON, &machines).unwrap_or_default())
    })
}

/// A database's `version` and the CPU entries of `machines` in it, without parsing the
/// other machines' entries (their text is only checked to be JSON) or a GPU section.
fn cpu_entries_of(text: &str, machines: &[String]) -> serde_json::Result<TuningDb> {
    #[derive(Deserialize)]
    struct Unparsed<'a> {
        #[serde(default)]
        version: u32,
        #[serde(borrow, default)]
        cpu: BTreeMap<String, &'a serde_json::value::RawValue>,
    }
    let db: Unparsed = serde_json::from_str(text)?;
    let cpu = db
        .cpu
        .into_iter()
        .filter(|(machine, _)| machines.contains(machine))
        .map(|(machine, shapes)| Ok((machine, serde_json::from_str(shapes.get())?)))
        .collect::<serde_json::Result<_>>()?;
    Ok(TuningDb {
        version: db.version,
        cpu,
        gpu: serde_json::Map::new(),
    })
}

/// What /proc/cpuinfo (Linux) says of this CPU, read once per process: every compilation
/// looks up the tuning database, and reading /proc/cpuinfo costs more than compiling a
/// small kernel.
struct CpuIdentity {
    /// The model name, or "unknown".
    model: String,
    /// The family and model numbers ("family 6 model 207"), where both can be read.
    generation: Option<String>,
}

fn cpu_identity() -> &'static CpuIdentity {
    static IDENTITY: std::sync::OnceLock<CpuIdentity> = std::sync::OnceLock::new();
    IDENTITY.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        // The first processor's line "name<tabs>: value".
        let field = |name: &str| {
            text.lines().find_map(|l| {
                let (key, value) = l.split_once(':')?;
                (key.trim() == name).then(|| value.trim().to_string())
            })
        };
        let generation = field("cpu family")
            .zip(field("model"))
            .map(|(family, model)| format!("family {family} model {model}"));
        CpuIdentity {
            model: field("model name").unwrap_or_else(|| "unknown".to_string()),
            generation,
        }
    })
}

/// This CPU's model name (from /proc/cpuinfo on Linux), or "unknown".
pub fn cpu_model() -> &'static str {
    &cpu_identity().model
}

/// The key of one machine: CPU model, generation and ISA, since a schedule is tuned for
/// all three ("Intel(R) Xeon(R) Processor (family 6 model 207) | avx512"). Virtual
/// machines often report a model name that many generations share; the family and model
/// numbers tell them apart. Where they cannot be read, the model name alone
/// ([`model_key`]).
pub fn machine_key(isa: Isa) -> String {
    match &cpu_identity().generation {
        Some(generation) => format!("{} ({generation}) | {isa}", cpu_model()),
        None => model_key(isa),
    }
}

/// `machine` ([`machine_key`]'s form) without its generation: the [`model_key`] it falls
/// back to, or None where it names no generation.
fn without_generation(machine: &str) -> Option<String> {
    let (name, rest) = machine.split_once(" (family ")?;
    let (_, isa) = rest.split_once(") | ")?;
    Some(format!("{name} | {isa}"))
}

/// The key by CPU model name and ISA only: entries stored before keys named the
/// generation, and ones meant for every generation that shares the name. Lookups fall back
/// to it.
pub fn model_key(isa: Isa) -> String {
    format!("{} | {isa}", cpu_model())
}

/// The key of one shape: what the blocking depends on (dtype, sizes and transposes of the
/// column-major problem); leading dimensions and scalar kinds share an entry.
pub fn shape_key(spec: &GemmSpec) -> String {
    let p = spec.col_major();
    let t = |t: Trans| if t == Trans::N { 'n' } else { 't' };
    format!(
        "{} {}x{}x{} {}{}",
        p.dtype.name(),
        p.m,
        p.n,
        p.k,
        t(p.trans_a),
        t(p.trans_b)
    )
}

impl TuningDb {
    /// Reads a database; a missing file is an empty database.
    pub fn load(path: &Path) -> Result<TuningDb, Error> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(TuningDb {
                    version: VERSION,
                    ..TuningDb::default()
                })
            }
            Err(e) => return Err(Error::TuningDb(format!("{}: {e}", path.display()))),
        };
        let db: TuningDb = serde_json::from_str(&text)
            .map_err(|e| Error::TuningDb(format!("{}: {e}", path.display())))?;
        if db.version != VERSION {
            return Err(Error::TuningDb(format!(
                "{}: version {} (this build reads {VERSION})",
                path.display(),
                db.version
            )));
        }
        Ok(db)
    }

    /// Writes the database, creating its directory.
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::TuningDb(format!("{}: {e}", dir.display())))?;
        }
        let text =
            serde_json::to_string_pretty(self).map_err(|e| Error::TuningDb(e.to_string()))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| Error::TuningDb(format!("{}: {e}", path.display())))
    }

    /// The tuned schedule for `spec` on this machine with `isa`, if any: this CPU
    /// generation's entry ([`machine_key`]), else its model name's ([`model_key`]).
    pub fn lookup(&self, isa: Isa, spec: &GemmSpec) -> Option<Schedule> {
        if self.cpu.is_empty() {
            return None;
        }
        let shape = shape_key(spec);
        [machine_key(isa), model_key(isa)]
            .iter()
            .find_map(|machine| self.cpu.get(machine)?.get(&shape).copied())
    }

    /// Records the tuned schedule for `spec` on this machine with `isa`.
    pub fn insert(&mut self, isa: Isa, spec: &GemmSpec, schedule: Schedule) {
        self.version = VERSION;
        self.cpu
            .entry(machine_key(isa))
            .or_default()
            .insert(shape_key(spec), schedule);
    }

    /// This database with the entries of `fallback` that it does not have (its own win,
    /// including its entries under a model name alone over `fallback`'s for a generation of
    /// that model, which lookups would otherwise find first).
    pub fn with_fallback(mut self, fallback: &TuningDb) -> TuningDb {
        for (machine, shapes) in &fallback.cpu {
            let model_wide = without_generation(machine);
            let has = |machine: &str, shape: &String| {
                self.cpu.get(machine).is_some_and(|m| m.contains_key(shape))
            };
            let missing: Vec<(String, Schedule)> = shapes
                .iter()
                .filter(|(shape, _)| {
                    !has(machine, shape) && !model_wide.as_deref().is_some_and(|m| has(m, shape))
                })
                .map(|(shape, schedule)| (shape.clone(), *schedule))
                .collect();
            self.cpu.entry(machine.clone()).or_default().extend(missing);
        }
        self
    }

    /// Schedules stored for this machine's generation with `isa` ([`machine_key`]).
    pub fn entries(&self, isa: Isa) -> usize {
        self.cpu.get(&machine_key(isa)).map_or(0, |m| m.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallgemm_ir::{Dtype, Layout};

    #[test]
    fn round_trips_and_keys_by_shape() {
        let dir = std::env::temp_dir().join(format!("smallgemm-tuning-{}", std::process::id()));
        let path = dir.join("db.json");
        let mut db = TuningDb::load(&path).unwrap();
        assert_eq!(db.entries(Isa::Avx512), 0);
        let spec = GemmSpec::builder(Dtype::F64, 5, 6, 7).build().unwrap();
        let s = Schedule {
            m_vectors: 1,
            n_cols: 3,
            ..smallgemm_ir::plan(&spec.col_major(), smallgemm_ir::Target::AVX512)
        };
        db.insert(Isa::Avx512, &spec, s);
        db.save(&path).unwrap();
        let back = TuningDb::load(&path).unwrap();
        assert_eq!(back, db);
        // Leading dimensions and scalars share the entry; row-major maps to its
        // column-major shape; other ISAs have their own.
        let padded = GemmSpec::builder(Dtype::F64, 5, 6, 7)
            .lda(9)
            .build()
            .unwrap();
        assert_eq!(back.lookup(Isa::Avx512, &padded), Some(s));
        let row = GemmSpec::builder(Dtype::F64, 6, 5, 7)
            .layout(Layout::RowMajor)
            .build()
            .unwrap();
        assert_eq!(shape_key(&row), "f64 5x6x7 nn");
        assert_eq!(back.lookup(Isa::Avx2, &spec), None);
        // A corrupt file is an error value.
        std::fs::write(&path, "{ not json").unwrap();
        assert!(matches!(TuningDb::load(&path), Err(Error::TuningDb(_))));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn generations_of_one_model_keep_their_own_entries() {
        let spec = GemmSpec::builder(Dtype::F64, 5, 6, 7).build().unwrap();
        let planned = smallgemm_ir::plan(&spec.col_major(), smallgemm_ir::Target::AVX512);
        let wide = Schedule {
            n_cols: 2,
            ..planned
        };
        let own = Schedule {
            n_cols: 3,
            ..planned
        };
        // An entry under the model name alone serves every generation of the model...
        let mut db = TuningDb::default();
        db.cpu
            .entry(model_key(Isa::Avx512))
            .or_default()
            .insert(shape_key(&spec), wide);
        assert_eq!(db.lookup(Isa::Avx512, &spec), Some(wide));
        // ... until this generation has its own.
        db.insert(Isa::Avx512, &spec, own);
        assert_eq!(db.lookup(Isa::Avx512, &spec), Some(own));
        assert_eq!(
            without_generation("Xeon (family 6 model 207) | avx512").as_deref(),
            Some("Xeon | avx512")
        );
        assert_eq!(without_generation("Xeon | avx512"), None);
        // A user's model-wide entry wins over a shipped one for a generation; the shipped
        // generation's other shapes fill in.
        let (generation, model) = ("Xeon (family 6 model 207) | avx512", "Xeon | avx512");
        let mut user = TuningDb::default();
        user.cpu
            .entry(model.into())
            .or_default()
            .insert("f64 5x6x7 nn".into(), wide);
        let mut shipped = TuningDb::default();
        let entries = shipped.cpu.entry(generation.into()).or_default();
        entries.insert("f64 5x6x7 nn".into(), own);
        entries.insert("f64 8x8x8 nn".into(), own);
        let merged = user.with_fallback(&shipped);
        assert!(!merged.cpu[generation].contains_key("f64 5x6x7 nn"));
        assert_eq!(merged.cpu[generation]["f64 8x8x8 nn"], own);
        assert_eq!(merged.cpu[model]["f64 5x6x7 nn"], wide);
    }

    #[test]
    fn shipped_database_parses_and_yields_to_the_users() {
        for text in [SHIPPED_CPU_JSON, SHIPPED_GPU_JSON] {
            let part: TuningDb = serde_json::from_str(text).unwrap();
            assert_eq!(part.version, VERSION);
        }
        let shipped = shipped();
        assert_eq!(shipped.version, VERSION);
        assert!(!shipped.gpu.is_empty());
        let shapes: usize = shipped.cpu.values().map(|m| m.len()).sum();
        assert!(shapes >= 62, "{shapes} shipped shapes");
        // The user's entry wins; the shipped ones fill the rest.
        let (machine, tuned) = shipped.cpu.iter().next().unwrap();
        let (shape, schedule) = tuned.iter().next().unwrap();
        let mine = Schedule {
            n_cols: schedule.n_cols + 1,
            ..*schedule
        };
        let mut user = TuningDb::default();
        user.cpu
            .entry(machine.clone())
            .or_default()
            .insert(shape.clone(), mine);
        let merged = user.with_fallback(shipped);
        assert_eq!(merged.cpu[machine][shape], mine);
        assert_eq!(merged.cpu[machine].len(), tuned.len());
    }

    #[test]
    fn the_jit_parses_only_the_machines_asked_for() {
        let full = shipped();
        let machines: Vec<&String> = full.cpu.keys().collect();
        assert!(machines.len() >= 2, "{machines:?}");
        // Each machine alone, and two together, come out as the whole parse has them.
        for machine in &machines {
            let one = cpu_entries_of(SHIPPED_CPU_JSON, &[machine.to_string()]).unwrap();
            assert_eq!(one.version, full.version);
            assert_eq!(one.cpu.len(), 1);
            assert_eq!(one.cpu[*machine], full.cpu[*machine]);
            assert!(one.gpu.is_empty());
        }
        let two: Vec<String> = machines[..2].iter().map(|m| m.to_string()).collect();
        let both = cpu_entries_of(SHIPPED_CPU_JSON, &two).unwrap();
        assert_eq!(both.cpu.keys().collect::<Vec<_>>(), machines[..2]);
        let none = cpu_entries_of(SHIPPED_CPU_JSON, &["no such CPU | avx2".to_string()]).unwrap();
        assert!(none.cpu.is_empty());
        // This CPU's share is the whole parse's entries under its keys.
        let mine = shipped_for_this_cpu();
        for isa in [Isa::Avx2, Isa::Avx512, Isa::Neon] {
            for key in [machine_key(isa), model_key(isa)] {
                assert_eq!(mine.cpu.get(&key), full.cpu.get(&key), "{key}");
            }
        }
        // Text that is not a database is an error, as with the whole parse.
        assert!(cpu_entries_of("{\"cpu\": [1]}", &two).is_err());
        assert!(cpu_entries_of("{} trailing", &two).is_err());
    }
}
