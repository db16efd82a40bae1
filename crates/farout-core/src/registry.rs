//! [`plugin_registry!`](crate::plugin_registry): the one list of a plug-in family (estimators,
//! indexes) that a config section selects by name.

/// Declares a serde enum of plug-in configs, one variant per plug-in, tagged by a config key.
///
/// ```ignore
/// plugin_registry! {
///     /// The gradient estimator of `[output]` (tag `estimator`) with its parameters.
///     pub enum EstimatorConfig: EstimatorParams, tag = "estimator" {
///         /// Exact cross-entropy.
///         Softmax(SoftmaxConfig) = "softmax",
///     }
/// }
/// ```
///
/// Each variant holds the plug-in's parameter struct (its keys, with their defaults, denying
/// unknown ones), which implements the family's trait (`EstimatorParams` above). The enum gets
/// `NAMES` (what the tag accepts), `name()`, `params()` (the variant as `&dyn Trait`) and
/// `deserialize_variant(name, deserializer)`, which reads one variant's parameters without the
/// tag: serde buffers internally tagged content and loses the key path of an error inside it,
/// and config readers call this to find the key again. A new plug-in is one line in the list.
/// The invoking crate depends on `serde`.
#[macro_export]
macro_rules! plugin_registry {
    (
        $(#[doc = $enum_doc:literal])*
        pub enum $enum:ident: $params_trait:ident, tag = $tag:literal {
            $($(#[doc = $doc:literal])* $variant:ident($params:ty) = $name:literal,)*
        }
    ) => {
        $(#[doc = $enum_doc])*
        #[derive(Clone, Debug, PartialEq, ::serde::Serialize, ::serde::Deserialize)]
        #[serde(tag = $tag)]
        pub enum $enum {
            $(
                $(#[doc = $doc])*
                #[serde(rename = $name)]
                $variant($params),
            )*
        }

        impl $enum {
            /// The names the tag accepts.
            pub const NAMES: &'static [&'static str] = &[$($name),*];

            /// The config name (the tag's value).
            pub fn name(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => $name,)*
                }
            }

            /// The parameters, behind the trait every member's parameters implement.
            pub fn params(&self) -> &dyn $params_trait {
                match self {
                    $(Self::$variant(p) => p,)*
                }
            }

            /// Deserializes the parameters of the member called `name` from `de`, a table
            /// without the tag key (config readers use it to name the exact key of an error).
            pub fn deserialize_variant<'de, D: ::serde::Deserializer<'de>>(
                name: &str,
                de: D,
            ) -> ::core::result::Result<Self, D::Error> {
                match name {
                    $($name => <$params as ::serde::Deserialize>::deserialize(de).map(Self::$variant),)*
                    _ => Err(<D::Error as ::serde::de::Error>::unknown_variant(name, Self::NAMES)),
                }
            }
        }
    };
}
